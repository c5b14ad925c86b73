"""The Boolean GOTU study: every (task, method) pair is one vmapped group over its seeds."""

from __future__ import annotations

import argparse
import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from maskjax import discover, executables, mask_patterns, overrides, plots, probes, runs, tables
from maskjax.errors import ConfigError
from maskjax.methods import Method
from maskjax.models.gotu import GotuTransformer
from maskjax.models.layers import ModelConfig
from maskjax.optim import OptimizerConfig, TrainConfig
from maskjax.overrides import option, with_default
from maskjax.sharding import to_host
from maskjax.studies.boolean_plots import plot_probes, plot_task
from maskjax.study import Group, Plan, Study, register
from maskjax.tasks.boolean import (
    TASKS,
    BooleanTask,
    cube,
    degree_profile,
    get_task,
    mask_pattern,
    minimum_degree_interpolator,
    pair_coefficient,
    parity_pair,
    probe_points,
    scores,
    seen_share,
)
from maskjax.train import Trained, TrainInputs, init_runs, variables_of


@dataclasses.dataclass(frozen=True, kw_only=True)
class BooleanConfig(OptimizerConfig):
    """schedules maps a task to (learning rate, epochs); steps, when set, overrides the epochs."""

    preset: str
    model: ModelConfig
    schedules: dict[str, tuple[float, int]]
    batch_size: int = option(256, help="examples per step")
    open_value: float = option(10.0, flag="open", help="mask logit of open entries")
    closed_value: float = option(-10.0, flag="closed", help="mask logit of closed entries")
    row_policy: str = option("diagonal", help=f"mask rows outside the groups: {', '.join(mask_patterns.ROW_POLICIES)}")
    eval_batch: int = option(4096, help="cube points scored at once")
    steps: int | None = option(None, help="training steps, overriding every task's epochs")
    optimizer: str = with_default(OptimizerConfig, "optimizer", "adam")

    def train_config(self, task: BooleanTask) -> TrainConfig:
        learning_rate, epochs = self.schedules[task.name]
        n_train = int(np.sum(task.seen(cube(task.n_bits))))
        steps = self.steps if self.steps is not None else epochs * (n_train // self.batch_size)
        return self.optimizer_config(steps, self.batch_size, learning_rate)


# Attention is measured on fixed random cube points, half seen and half unseen (`probe_points`): the
# drift probe after every chunk on PROBE_POINTS, the attention maps and pattern errors on MAP_POINTS.
# The gradient probe averages the gradient norms of GRADIENT_BATCHES random training batches.
PROBE_POINTS = 128
MAP_POINTS = 512
GRADIENT_BATCHES = 2
PROBE_SEED = 0


PAPER_SCHEDULES = {"2parity": (1e-5, 20), "cyclic3": (2e-5, 80), "majority3": (1e-5, 30), "threesym": (2e-5, 40)}
# Our held-out tasks, not in the paper, borrow the schedule of the paper task they resemble.
SCHEDULES = PAPER_SCHEDULES | {"majority5": PAPER_SCHEDULES["majority3"], "pairsum": PAPER_SCHEDULES["2parity"]}
PAPER_WIDTH = 256


def _rung(name: str, model: ModelConfig) -> BooleanConfig:
    scale = PAPER_WIDTH / model.dim
    return BooleanConfig(
        preset=name, model=model, schedules={task: (scale * lr, epochs) for task, (lr, epochs) in SCHEDULES.items()}
    )


PRESETS: dict[str, BooleanConfig] = {
    "paper": BooleanConfig(preset="paper", model=ModelConfig(256, 12, 6, 64, 256), schedules=SCHEDULES),
    # The paper scaled down on compute grounds alone (docs/design.md): width / 8, depth / 6, Adam's
    # learning rate x 8 (lr ~ 1/width), half the epochs. About 1/898 of the paper's training FLOPs per run.
    "quick": BooleanConfig(
        preset="quick",
        model=ModelConfig(dim=32, depth=2, heads=2, head_dim=16, mlp_dim=32),
        schedules={name: (8 * lr, epochs // 2) for name, (lr, epochs) in SCHEDULES.items()},
    ),
    # The scale ladder of issue 16 (docs/design.md, Presets): width and depth together, Adam's learning
    # rate x paper_width / width as in quick, the paper's epochs. `medium` is chosen among these by
    # the vanilla-only rule written there.
    "w64d4": _rung("w64d4", ModelConfig(dim=64, depth=4, heads=4, head_dim=16, mlp_dim=64)),
    "w128d6": _rung("w128d6", ModelConfig(dim=128, depth=6, heads=4, head_dim=32, mlp_dim=128)),
    "test": BooleanConfig(
        preset="test",
        model=ModelConfig(dim=16, depth=1, heads=2, head_dim=8, mlp_dim=16),
        schedules={name: (1e-3, 1) for name in SCHEDULES},
        chunk_steps=5,
        steps=10,
        eval_batch=8192,
        qk_opt_steps=20,
    ),
}


# By that rule (docs/results/boolean_scale.md): quick fails it on every task, w64d4 passes it on 2Parity,
# Majority and ThreeSym, and a medium table at w128d6 (about 81 h of CPU) is beyond reach.
PRESETS["medium"] = dataclasses.replace(PRESETS["w64d4"], preset="medium")


def task_mask_logits(
    task: BooleanTask,
    method: Method,
    config: BooleanConfig,
    seed: int = 0,
    values: tuple[float, float] | None = None,
) -> np.ndarray:
    """The method's initial M over [CLS, bits] for one seed, before broadcasting to heads.

    values: (open, closed) logits for this run; the config's when None.
    """
    values = values if values is not None else (config.open_value, config.closed_value)
    return runs.initial_mask_logits(
        lambda kind, s: task_pattern(task, kind, config.row_policy, s), method, seed, values
    )


def task_pattern(task: BooleanTask, kind: str, row_policy: str, seed: int = 0) -> np.ndarray:
    """A mask pattern of the task by kind: the task's own (`tasks.boolean.mask_pattern`), or "learned",
    the one `maskjax.discover` reads off the training data."""
    if kind == "learned":
        return discover.task_pattern(task, row_policy)
    return mask_pattern(task, kind, row_policy, seed)


def oracle_pattern(task: BooleanTask, config: BooleanConfig) -> np.ndarray:
    return mask_pattern(task, "oracle", config.row_policy)


def make_model(task: BooleanTask, method: Method, config: BooleanConfig, mask_init=None) -> GotuTransformer:
    return GotuTransformer(task.n_bits, config.model, method.mask_mode, mask_init, method.qk_norm)


def layer0_attention(model: GotuTransformer, variables: dict, x: jax.Array) -> jax.Array:
    """Layer-0 attention on the inputs x: [batch, heads, tokens, tokens]."""
    return runs.sown(model, variables, x, "attention")[0]


def drift_probe(
    model: GotuTransformer,
    method: Method,
    task: BooleanTask,
    loss: Callable,
    gradient_batches: tuple[jax.Array, jax.Array],
) -> Callable:
    """probe(initial, state) for `train`, per layer: the total-variation distance of the attention on
    `probe_points` from its initial value, as the cube's mean (`attention_drift`) and per region
    (`attention_drift_seen`, `attention_drift_unseen`); the mean absolute change of the prior's logits
    (`prior_logit_drift`: log_sigmoid(M) for a mask, the q.k logits on the probe points otherwise); for a
    mask, |M_t - M_0| on its open and closed entries apart (`probes.CHANGE_KEYS`); and the gradient norms
    reaching the mask (`grad_norm_mask`, 0 without a learnable mask) and the query / key kernels
    (`grad_norm_qk`), averaged over the `gradient_batches` [batches, batch_size, ...]."""
    depth = model.config.depth
    x_np, seen_np = probe_points(task, PROBE_POINTS, PROBE_SEED)
    x, seen, share = jnp.asarray(x_np), jnp.asarray(seen_np), seen_share(task)
    has_mask = method.mask_mode != "none"

    def gradient_norms(params, constants) -> tuple[jax.Array, jax.Array]:
        def norms(batch):
            grads = jax.grad(loss)(params, constants, batch)
            attn = [grads[f"block_{i}"]["attn"] for i in range(depth)]
            qk = jnp.stack([jnp.linalg.norm(a["qkv"]["kernel"][:, :2]) for a in attn])
            mask = jnp.stack([jnp.linalg.norm(a["mask_logits"]) if "mask_logits" in a else 0.0 for a in attn])
            return mask, qk

        mask, qk = jax.lax.map(norms, gradient_batches)
        return mask.mean(0), qk.mean(0)

    def measured(variables: dict) -> tuple[jax.Array, jax.Array, jax.Array | None]:
        """Attention [layers, points, heads, N, N], the prior's logits and, for a mask, M."""
        _, state = model.apply(variables, x, mutable=["intermediates"])
        blocks = [state["intermediates"][f"block_{i}"]["attn"] for i in range(depth)]
        attention = jnp.stack([b["attention"][0] for b in blocks])
        if not has_mask:
            return attention, jnp.stack([b["qk_logits"][0] for b in blocks]), None
        masks = runs.mask_logits_of(model, method, variables)
        return attention, jax.nn.log_sigmoid(masks), masks

    def probe(initial, state) -> dict[str, jax.Array]:
        attention_0, prior_0, masks_0 = measured(variables_of(initial.params, initial.constants))
        attention, prior, masks = measured(variables_of(state.params, state.constants))
        moved_PL = probes.row_total_variation(attention, attention_0).mean(axis=(2, 3)).T
        drift = probes.region_means(moved_PL, seen, share)
        logits_moved = jnp.abs(prior - prior_0)
        if has_mask:
            logit_drift = logits_moved.reshape(depth, -1).mean(-1)
        else:
            logit_drift = probes.region_means(logits_moved.mean(axis=(2, 3, 4)).T, seen, share)["all"]
        grad_mask, grad_qk = gradient_norms(state.params, state.constants)
        return {
            "attention_drift": drift["all"],
            "attention_drift_seen": drift["seen"],
            "attention_drift_unseen": drift["unseen"],
            "prior_logit_drift": logit_drift,
            **(probes.mask_logit_change(masks_0, masks) if has_mask else {}),
            "grad_norm_mask": grad_mask,
            "grad_norm_qk": grad_qk,
        }

    return probe


def probe_batches(data: tuple[jax.Array, jax.Array], batch_size: int) -> tuple:
    """GRADIENT_BATCHES batches drawn as training draws them (batch_size distinct training points, at
    random), with a fixed seed: [batches, batch_size, ...]."""
    rng = np.random.default_rng(PROBE_SEED)
    n_train = data[0].shape[0]
    index = np.stack([rng.choice(n_train, batch_size, replace=False) for _ in range(GRADIENT_BATCHES)])
    return jax.tree.map(lambda a: a[index], data)


def learned_recovery(task: BooleanTask, config: BooleanConfig) -> dict:
    """How the pattern found from the training data compares with the oracle's (`discover.recovery`)."""
    learned = discover.task_pattern(task, config.row_policy)
    return {f"learned_{k}": v for k, v in discover.recovery(learned, oracle_pattern(task, config)).items()}


def oracle_target(task: BooleanTask, config: BooleanConfig) -> np.ndarray:
    """The attention the oracle mask asks for, softmax(log_sigmoid(M)) per row: [tokens, tokens]."""
    pattern = oracle_pattern(task, config)
    logits = mask_patterns.mask_logits(pattern, config.open_value, config.closed_value)
    return mask_patterns.row_distribution(np.asarray(logits))


class BooleanGroup(NamedTuple):
    """What one group trains: a task by a method; mask_values, when given, are run i's open and closed
    logits (numbers only, so a whole contrast grid shares one compiled program)."""

    task: BooleanTask
    method: Method
    mask_values: tuple[tuple[float, float], ...] | None = None


class BooleanInputs(NamedTuple):
    """One group's training inputs, and what its records need."""

    inputs: TrainInputs
    model: GotuTransformer
    mask_values: list[tuple[float, float]]


def make_group(group: BooleanGroup, seeds: Sequence[int], config: BooleanConfig) -> BooleanInputs:
    """The one-run init, loss and drift probe of (task, method) and the per-run inputs of every seed."""
    task, method, mask_values = group
    if mask_values is not None and len(mask_values) != len(seeds):
        raise ConfigError(f"{len(mask_values)} mask values for {len(seeds)} runs")
    values = list(mask_values) if mask_values is not None else [(config.open_value, config.closed_value)] * len(seeds)
    points = cube(task.n_bits)
    seen = np.asarray(task.seen(points), bool)
    data = (jnp.asarray(points[seen], jnp.float32), jnp.asarray(task.target(points), jnp.float32)[seen])
    model = make_model(task, method, config)
    run_masks = jnp.asarray(
        np.stack([task_mask_logits(task, method, config, seed, v) for seed, v in zip(seeds, values, strict=True)])
    )
    heads = config.model.heads
    pattern_HNN = jnp.broadcast_to(
        jnp.asarray(oracle_pattern(task, config), jnp.float32), (heads, *run_masks.shape[1:])
    )
    target_HNN = jnp.broadcast_to(jnp.asarray(oracle_target(task, config), jnp.float32), pattern_HNN.shape)

    init_run = runs.prior_init(
        lambda mask_logits: make_model(task, method, config, mask_logits),
        method,
        data[0][:1],
        pattern_HNN,
        target_HNN,
        config.qk_opt_steps,
    )

    def loss(params, constants, batch):
        x, y = batch
        return jnp.mean((model.apply(variables_of(params, constants), x) - y) ** 2)

    probe = drift_probe(model, method, task, loss, probe_batches(data, config.batch_size))
    inputs = TrainInputs(
        init_run, loss, runs.seed_keys(seeds), (run_masks,), data, config.train_config(task), probe=probe
    )
    return BooleanInputs(inputs, model, values)


def record_group(
    group: BooleanGroup,
    seeds: Sequence[int],
    config: BooleanConfig,
    built: BooleanInputs,
    trained: Trained,
    started: float,
) -> tuple[list[dict], dict[str, np.ndarray]]:
    """One record per seed of a trained (task, method) group, scored on the whole cube, and the groups's
    layer-0 attention maps at init and after training."""
    task, method, _ = group
    model, values = built.model, built.mask_values
    points = cube(task.n_bits)
    seen = np.asarray(task.seen(points), bool)
    target = oracle_target(task, config)
    initial, final, drift, drift_steps = trained.initial, trained.final, trained.probes, trained.probe_steps
    preds = runs.evaluate_runs(
        lambda variables, batch, filler: model.apply(variables, batch[0]),
        final,
        [np.asarray(points, np.float32)],
        config.eval_batch,
        summed=False,
    )
    on_maps = MapPoints(task, model)
    attention_init, attention_final = on_maps.attention(initial), on_maps.attention(final)
    maps = {"init": on_maps.mean(attention_init), "final": on_maps.mean(attention_final)}
    failed = ~np.all(np.isfinite(preds), axis=1)
    outcomes = runs.outcome_fields(trained, built.inputs.train_config, time.time() - started, failed)
    recovery = learned_recovery(task, config) if method.mask_pattern == "learned" else {}
    pair = parity_pair(task)
    records = []
    for i, seed in enumerate(seeds):
        if outcomes[i]["diverged"]:
            metrics = dict.fromkeys(("acc_all", "acc_unseen", "mse", "unseen_mean_prediction"))
        else:
            metrics = {
                **scores(task, preds[i]),
                "unseen_mean_prediction": float(preds[i][~seen].mean()),
                "degree_profile": [round(float(m), runs.STORED_DECIMALS) for m in degree_profile(preds[i])],
                **({"pair_coefficient": pair_coefficient(preds[i], pair)} if pair else {}),
            }
        records.append(
            {
                "task": task.name,
                "method": method.name,
                "seed": int(seed),
                **(
                    {"open_value": float(values[i][0]), "closed_value": float(values[i][1])}
                    if method.mask_pattern not in ("none", "zero")
                    else {}
                ),
                **metrics,
                **recovery,
                "pattern_error_init": on_maps.error(attention_init[i], target),
                "pattern_drift": on_maps.error(attention_final[i], attention_init[i]),
                "drift_steps": drift_steps,
                **{name: [[float(f"{v:.6g}") for v in step] for step in series[i]] for name, series in drift.items()},
                **outcomes[i],
            }
        )
    return records, maps


class MapPoints:
    """Layer 0's attention on MAP_POINTS `probe_points` of a task, and the cube's means of it: the maps
    of the attention plots and the pattern errors (mean total-variation distance of the attention rows
    from a target's, in [0, 1])."""

    def __init__(self, task: BooleanTask, model: GotuTransformer):
        x, self.seen = probe_points(task, MAP_POINTS, PROBE_SEED)
        self.share = seen_share(task)
        self._attention = executables.jit(
            jax.vmap(lambda p, c: layer0_attention(model, variables_of(p, c), jnp.asarray(x)))
        )

    def attention(self, state) -> np.ndarray:
        """[runs, points, heads, N, N] for a stacked RunState."""
        return to_host(self._attention(state.params, state.constants))

    def mean(self, attention_RPHNN: np.ndarray) -> np.ndarray:
        """Per run, the cube's mean over points and heads: [runs, N, N]."""
        return np.stack([probes.region_weighted(a.mean(1), self.seen, self.share) for a in attention_RPHNN])

    def error(self, attention_PHNN: np.ndarray, target: np.ndarray) -> float:
        rows = 0.5 * np.abs(np.asarray(attention_PHNN, np.float64) - np.asarray(target, np.float64)).sum(-1)
        return float(probes.region_weighted(rows.mean(axis=(1, 2)), self.seen, self.share))


def init_pattern_errors(task: BooleanTask, method: Method, seeds: Sequence[int], config: BooleanConfig) -> list[float]:
    """Each seed's pattern_error_init without training: how well layer 0 matches the oracle target at init.

    The runs are initialised exactly as training initialises them, so the numbers are the same.
    """
    built = make_group(BooleanGroup(task, method), seeds, config)
    initial = init_runs(built.inputs.program(), built.inputs.run_keys, built.inputs.run_inputs)
    on_maps = MapPoints(task, built.model)
    target = oracle_target(task, config)
    return [on_maps.error(m, target) for m in on_maps.attention(initial)[: len(seeds)]]


def mdi_record(task: BooleanTask) -> dict:
    """The MDI's scores. Its unseen mean is rounded (and -0.0 made 0): the float64 solve's last bits
    depend on the CPU's BLAS kernels, and a mean that is 0 should not print as -1.11e-16 on some CPUs."""
    points, values = minimum_degree_interpolator(task)
    unseen = ~np.asarray(task.seen(points), bool)
    return {
        "task": task.name,
        "method": "mdi",
        **scores(task, values),
        "unseen_mean_prediction": round(float(values[unseen].mean()), 9) + 0.0,
        "degree_profile": [round(float(m), runs.STORED_DECIMALS) for m in degree_profile(values)],
        **({"pair_coefficient": round(pair_coefficient(values, pair), 9) + 0.0} if (pair := parity_pair(task)) else {}),
    }


@dataclasses.dataclass(frozen=True)
class BooleanScope:
    tasks: tuple[str, ...] = option(("2parity",), help=f"comma list of {','.join(TASKS)}")


KEYS = ("acc_all", "acc_unseen", "mse", "unseen_mean_prediction", "train_loss")
SEED_KEYS = ("acc_all", "unseen_mean_prediction")


def summary_markdown(records: list[dict], reference: list[dict], group_by: tuple[str, ...] = ("task", "method")) -> str:
    """Mean +- std per group (beside the MDI's own scores), the seeds above the MDI per group with
    Fisher's exact test against vanilla, and per-seed tables: the body of every Boolean summary.md."""
    parts = [
        tables.summary_table(reference + records, KEYS, group_by),
        "Seeds that reach / exceed the task's MDI in acc_all:\n\n" + tables.count_table(records, reference, group_by),
        *[tables.per_seed_table(records, key, group_by) for key in SEED_KEYS],
    ]
    return "\n".join(parts)


def check_config(config: BooleanConfig) -> None:
    if config.row_policy not in mask_patterns.ROW_POLICIES:
        raise ConfigError(f"unknown row policy {config.row_policy!r}; known: {', '.join(mask_patterns.ROW_POLICIES)}")


class BooleanStudy(Study):
    """Every (task, method) pair is one group over its seeds; the MDI's scores stand beside the runs."""

    name = "boolean"
    title = "Boolean GOTU study"
    description = "Boolean generalisation-on-the-unseen study: python -m experiments.boolean --seeds=8"
    config_type = BooleanConfig
    scope_type = BooleanScope
    presets = PRESETS
    default_seeds = 8
    default_methods = ("vanilla", "mask", "mask_fixed", "mask_zero")
    benchmark_scope = BooleanScope(tasks=("2parity",))
    # docs/benchmarks/issue48_xla_flags_quick_manual.txt: 1.16x at one seed, 1.06x at 8 (medium: slower)
    cpu_xla_flags = {"quick": ("--xla_cpu_experimental_ynn_fusion_type=individual_dot",)}

    def add_flags(self, parser: argparse.ArgumentParser) -> None:
        rate = overrides.flag_type(float, {"above": 0}, "learning_rate")
        parser.add_argument("--learning-rate", type=rate, help="one learning rate for every task")

    def apply_flags(self, config: BooleanConfig, args: argparse.Namespace) -> BooleanConfig:
        if getattr(args, "learning_rate", None) is None:
            return config
        schedules = {task: (args.learning_rate, epochs) for task, (_, epochs) in config.schedules.items()}
        return dataclasses.replace(config, schedules=schedules)

    def check(self, config: BooleanConfig, scope: BooleanScope) -> None:
        check_config(config)

    def check_method(self, method: Method, config: BooleanConfig, scope: BooleanScope) -> None:
        for task in self.make_data(config, scope, lambda message: None):
            try:
                task_mask_logits(task, method, config)
            except ConfigError as e:
                raise ConfigError(f"{method.name} on {task.name}: {e}") from None

    def make_data(self, config: BooleanConfig, scope: BooleanScope, log: Callable[[str], None]) -> list[BooleanTask]:
        return [get_task(t) for t in scope.tasks]

    def groups(self, plan: Plan) -> list[Group[BooleanGroup]]:
        return [
            Group({"task": task.name, "method": method.name}, BooleanGroup(task, method))
            for task in plan.data
            for method in plan.methods
        ]

    def describe(self, plan: Plan) -> dict:
        return {
            "steps": {t.name: plan.config.train_config(t).steps for t in plan.data},
            "train": {t.name: dataclasses.asdict(plan.config.train_config(t)) for t in plan.data},
        }

    def reference(self, plan: Plan) -> list[dict]:
        return [mdi_record(t) for t in plan.data]

    def build(self, config: BooleanConfig, spec: BooleanGroup, seeds: Sequence[int]) -> BooleanInputs:
        return make_group(spec, seeds, config)

    def record(self, config, spec: BooleanGroup, seeds, built: BooleanInputs, trained: Trained, started: float):
        return record_group(spec, seeds, config, built, trained, started)

    def summary(self, plan: Plan, records: list[dict], reference: list[dict]) -> tuple[str, str]:
        return summary_markdown(records, reference), tables.summary_table(reference + records, KEYS, ("task", "method"))

    def plot(self, plan: Plan, records: list[dict], reference: list[dict], maps) -> None:
        for task in plan.data:
            task_records = [r for r in records if r.get("task") == task.name]
            if not task_records:
                continue
            trained = dict.fromkeys(r["method"] for r in task_records)
            arrays = {m: a for m in trained if (a := maps({"task": task.name, "method": m})) is not None}
            prior = {
                f"prior: open entries ({plan.config.row_policy})": oracle_pattern(task, plan.config).astype(float),
                "target: softmax(log_sigmoid(M))": oracle_target(task, plan.config),
            }
            plot_task(plan.out, task, prior, arrays)
            plot_probes(plan.out, task.name, task_records)
        done = {r["task"] for r in records}
        plots.plot_accuracy([r for r in reference if r["task"] in done] + records, plan.out / "accuracy.png")


STUDY = register(BooleanStudy())
