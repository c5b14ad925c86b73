"""The low-data arithmetic study: one (op, training fraction, method) is one vmapped group over its seeds.

Every seed draws its own training subset (`tasks.arithmetic.split`), so the data carries the runs
axis; runs with different fractions have training sets of different sizes and are separate batches.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from maskjax import mask_patterns, plots, qk_priors, runs, tables
from maskjax.checkpoint import SweepCheckpoints
from maskjax.errors import ConfigError
from maskjax.methods import Method, check_in_study, get_method
from maskjax.models.causal import CausalTransformer
from maskjax.models.layers import ModelConfig
from maskjax.overrides import option
from maskjax.study import Group, Plan, Study
from maskjax.tasks import arithmetic as ar
from maskjax.train import (
    TrainConfig,
    cosine_train_config,
    mask_decay_option,
    optimizer_option,
    to_host,
    train,
    variables_of,
)


@dataclasses.dataclass(frozen=True)
class ArithmeticConfig:
    """epochs over each run's training subset set the steps unless `steps` overrides them."""

    preset: str
    model: ModelConfig
    learning_rate: float = option(1e-3, above=0, help="peak learning rate (cosine decay)")
    weight_decay: float = option(1e-3, minimum=0, help="weight decay")
    batch_size: int = option(256, help="pairs per step (at most the training subset)")
    epochs: int = option(50, help="epochs over each training subset")
    steps: int | None = option(None, help="training steps, overriding the epochs")
    open_value: float = option(5.0, flag="open", help="mask logit of open entries")
    closed_value: float = option(-5.0, flag="closed", help="mask logit of closed entries")
    answer_format: str = option("reversed", choices=ar.FORMATS, help="answer digit order (reversed: units first)")
    eval_size: int = option(10_000, help="held-out pairs scored per seed")
    chunk_steps: int = option(200, help="steps per compiled chunk")
    qk_opt_steps: int = option(10_000, minimum=0, help="Adam steps that fit the optimised QK prior")
    qk_position_scale: float = option(
        qk_priors.POSITION_SCALE, above=0, help="factor on the position embeddings under the QK-SVD and QK-opt priors"
    )
    optimizer: str = optimizer_option("adamw")
    mask_weight_decay: float | None = mask_decay_option()

    def train_config(self, n_train: int) -> TrainConfig:
        batch = min(self.batch_size, n_train)
        steps = self.steps if self.steps is not None else self.epochs * (n_train // batch)
        return cosine_train_config(self, steps, batch)


PRESETS: dict[str, ArithmeticConfig] = {
    "paper": ArithmeticConfig("paper", ModelConfig(dim=256, depth=6, heads=4, head_dim=64, mlp_dim=256)),
    # Width / 4, depth / 3, the paper's optimizer, schedule, batch and epochs: minutes per batch on a CPU.
    "quick": ArithmeticConfig("quick", ModelConfig(dim=64, depth=2, heads=4, head_dim=16, mlp_dim=64), eval_size=4096),
    # The ladder's rung a128d4 with the paper's plain answers (docs/design.md, "Sizes that learn", issue 43):
    # the size at which the low-data claims are tested, by a floor in the paper's own vanilla regime.
    "medium": ArithmeticConfig(
        "medium",
        ModelConfig(dim=128, depth=4, heads=4, head_dim=32, mlp_dim=512),
        answer_format="plain",
        eval_size=4096,
    ),
    "test": ArithmeticConfig(
        "test",
        ModelConfig(dim=16, depth=1, heads=2, head_dim=8, mlp_dim=16),
        steps=10,
        chunk_steps=5,
        eval_size=64,
        qk_opt_steps=20,
    ),
}


def get_preset(name: str) -> ArithmeticConfig:
    return runs.get_preset(PRESETS, name)


def mask_logits(task: ar.ArithmeticTask, method: Method, config: ArithmeticConfig) -> np.ndarray:
    """The method's initial M [length, length] (zeros for the zero mask; unused without a mask)."""
    patterns = functools.partial(ar.mask_pattern, task)
    return runs.initial_mask_logits(patterns, method, 0, (config.open_value, config.closed_value))


def make_model(task: ar.ArithmeticTask, method: Method, config: ArithmeticConfig, mask_init=None) -> CausalTransformer:
    return CausalTransformer(ar.VOCAB, task.length, config.model, method.mask_mode, mask_init, method.qk_norm)


def answer_loss(logits_BLV: jax.Array, tokens_BL: jax.Array) -> jax.Array:
    """Cross-entropy of the answer tokens, each predicted from the position before it."""
    predicted = logits_BLV[:, ar.PROMPT - 1 : -1]
    return optax.softmax_cross_entropy_with_integer_labels(predicted, tokens_BL[:, ar.PROMPT :]).mean()


def greedy_answers(model: CausalTransformer, variables: dict, tokens_BL: jax.Array, answer_digits: int) -> jax.Array:
    """Decode the answer digits one at a time from the prompt alone: [batch, answer_digits]."""
    buffer = jnp.asarray(tokens_BL).at[:, ar.PROMPT :].set(0)

    def write(buffer: jax.Array, offset: jax.Array) -> tuple[jax.Array, None]:
        logits = model.apply(variables, buffer)[:, ar.PROMPT - 1 + offset, : ar.DIGITS]
        return jax.lax.dynamic_update_slice(
            buffer, jnp.argmax(logits, -1)[:, None].astype(buffer.dtype), (0, ar.PROMPT + offset)
        ), None

    buffer, _ = jax.lax.scan(write, buffer, jnp.arange(answer_digits))
    return buffer[:, ar.PROMPT :]


def run_data(task: ar.ArithmeticTask, fraction: float, seed: int, eval_size: int) -> tuple[np.ndarray, np.ndarray]:
    """(training sequences, evaluation sequences) of one seed: its training subset, and `eval_size` of its
    held-out pairs drawn with the same seed (all of them when eval_size covers them)."""
    a, b = ar.operands()
    train_idx, held_idx = ar.split(fraction, seed)
    pick = np.random.default_rng([seed, 1]).permutation(held_idx)[:eval_size]
    return ar.sequences(task, a[train_idx], b[train_idx]), ar.sequences(task, a[pick], b[pick])


def training_sample(train_BNL: np.ndarray, seeds: Sequence[int], size: int) -> np.ndarray:
    """Up to `size` of each seed's training sequences, drawn with its seed: whether the model fits its
    training pairs (`train_seq_acc`, exact match by greedy decoding, as on the held-out pairs)."""
    n_train = train_BNL.shape[1]
    picks = [np.random.default_rng([seed, 2]).permutation(n_train)[: min(size, n_train)] for seed in seeds]
    return np.stack([train_BNL[i, pick] for i, pick in enumerate(picks)])


class GroupInputs(NamedTuple):
    """What `train` needs for one (op, fraction, method) group; each run trains on its own subset."""

    model: CausalTransformer
    init_run: Callable
    loss: Callable
    run_keys: jax.Array
    data: jax.Array
    eval_data: jax.Array
    train_config: TrainConfig
    target: np.ndarray


def make_group(
    task: ar.ArithmeticTask, method: Method, fraction: float, seeds: Sequence[int], config: ArithmeticConfig
) -> GroupInputs:
    """The one-run init and loss of (op, fraction, method), and every seed's key, training and evaluation
    sequences."""
    prior = mask_logits(task, method, config)
    per_seed = [run_data(task, fraction, seed, config.eval_size) for seed in seeds]
    train_BNL = jnp.asarray(np.stack([d[0] for d in per_seed]))
    eval_BNL = jnp.asarray(np.stack([d[1] for d in per_seed]))
    model = make_model(task, method, config)
    open_HNN = jnp.broadcast_to(
        jnp.asarray(ar.place_value_pattern(task), jnp.float32), (config.model.heads, *prior.shape)
    )
    target_HNN = jnp.broadcast_to(jnp.asarray(mask_patterns.row_distribution(prior), jnp.float32), open_HNN.shape)

    init_run = runs.prior_init(
        lambda: make_model(task, method, config, prior),
        method,
        train_BNL[0, :1],
        open_HNN,
        target_HNN,
        config.qk_opt_steps,
        config.qk_position_scale,
    )

    def loss(params, constants, tokens_BL):
        return answer_loss(model.apply(variables_of(params, constants), tokens_BL), tokens_BL)

    train_config = config.train_config(train_BNL.shape[1])
    causal = np.tril(np.ones(prior.shape, bool))
    target = np.broadcast_to(mask_patterns.row_distribution(np.where(causal, prior, -np.inf)), open_HNN.shape)
    return GroupInputs(model, init_run, loss, runs.seed_keys(seeds), train_BNL, eval_BNL, train_config, target)


# Seed 0's first training sequences, on which every run's layer-0 attention at init is held against the prior.
PATTERN_PROBES = 64


def run_group(
    task: ar.ArithmeticTask,
    method: Method,
    fraction: float,
    seeds: Sequence[int],
    config: ArithmeticConfig,
    log: Callable[[str], None] | None = None,
    checkpoints: SweepCheckpoints | None = None,
    resume: bool = False,
) -> list[dict]:
    """Train (op, fraction, method) for every seed as one vmapped group; one record per seed."""
    batch = make_group(task, method, fraction, seeds, config)
    model, train_config, eval_BNL = batch.model, batch.train_config, batch.eval_data
    n_train = batch.data.shape[1]
    started = time.time()
    trained = train(
        batch.init_run,
        batch.loss,
        batch.run_keys,
        (),
        batch.data,
        train_config,
        log,
        label=f"{task.op} {fraction:g} {method.name}",
        checkpoints=checkpoints,
        resume=resume,
        data_per_run=True,
    )
    final = trained.final

    @jax.jit
    @jax.vmap
    def decode(params, constants, tokens_BL):
        return greedy_answers(model, variables_of(params, constants), tokens_BL, task.answer_digits)

    answers = to_host(decode(final.params, final.constants, eval_BNL))
    truth = np.asarray(eval_BNL)[:, :, ar.PROMPT :]
    fit_BNL = training_sample(np.asarray(batch.data), seeds, config.eval_size)
    fit_correct = to_host(decode(final.params, final.constants, jnp.asarray(fit_BNL))) == fit_BNL[:, :, ar.PROMPT :]
    answer_rows = slice(ar.PROMPT - 1, -1)  # the queries that write the answer: the rows the prior shapes
    pattern_error = runs.layer0_pattern_error(
        model, trained.initial, batch.data[0, :PATTERN_PROBES], batch.target, answer_rows
    )
    outcomes = runs.outcome_fields(trained, train_config, time.time() - started)
    records = []
    for i, seed in enumerate(seeds):
        correct = answers[i] == truth[i]
        diverged = outcomes[i]["diverged"]
        records.append(
            {
                "op": task.op,
                "answer_format": task.answer_format,
                "train_fraction": fraction,
                "method": method.name,
                "seed": int(seed),
                "seq_acc": None if diverged else float(correct.all(axis=1).mean()),
                "token_acc": None if diverged else float(correct.mean()),
                "train_seq_acc": None if diverged else float(fit_correct[i].all(axis=1).mean()),
                "n_train": int(n_train),
                "eval_size": int(truth.shape[1]),
                "pattern_error_init": pattern_error[i],
                **outcomes[i],
            }
        )
        records[-1]["train_loss_fall"] = runs.loss_fall(records[-1])
    return records


def resolve(
    ops: Sequence[str], methods: Sequence[str], answer_format: str
) -> tuple[list[ar.ArithmeticTask], list[Method]]:
    """Tasks and methods by name; anything that cannot be built fails here, before any training."""
    tasks = [ar.ArithmeticTask(op, answer_format) for op in ops]
    resolved = [get_method(m) for m in methods]
    for method in resolved:
        check_in_study(method, "arithmetic")
    for task in tasks:
        for method in resolved:
            try:
                ar.mask_pattern(task, runs.mask_kind(method))
            except ConfigError as e:
                raise ConfigError(f"method {method.name!r}: {e}") from None
    return tasks, resolved


LADDER_FIT = 0.99  # training exact match that counts as fitting the training pairs


def ladder_rule(records: Sequence[dict], fit: float = LADDER_FIT) -> dict:
    """docs/design.md's rule for one (rung, op, fraction): how many vanilla seeds fit their training pairs
    (`train_seq_acc` at least `fit`); passes when at least three quarters do."""
    fitted = [r.get("train_seq_acc") is not None and r["train_seq_acc"] >= fit for r in records]
    return runs.seed_verdict(fitted)


# The paper's vanilla held-out exact match where its low-data claims live (../shared/paper.md), and how much
# the training loss may still fall over the last tenth of the steps: the floor of issue 43 (docs/design.md).
PAPER_VANILLA = {("mul", 0.03): 0.0501, ("add", 0.004): 0.0119}
FLAT_TOLERANCE = 0.05


def baseline_floor(records: Sequence[dict], tolerance: float = FLAT_TOLERANCE) -> dict:
    """docs/design.md's floor for one (op, fraction): how many vanilla seeds reach the paper's vanilla on
    held-out pairs with a flat training loss; passes when at least three quarters do (6 of 8)."""
    passed = []
    for r in records:
        paper = PAPER_VANILLA.get((r["op"], r["train_fraction"]))
        if paper is None:
            raise ConfigError(f"the paper gives no vanilla for {r['op']} at {r['train_fraction']:g}")
        fall = runs.loss_fall(r)
        passed.append(r.get("seq_acc") is not None and r["seq_acc"] >= paper and fall is not None and fall <= tolerance)
    return runs.seed_verdict(passed)


@dataclasses.dataclass(frozen=True)
class ArithmeticScope:
    ops: tuple[str, ...] = option(("add", "mul"), help=f"comma list of {','.join(ar.OPS)}")
    train_fractions: tuple[float, ...] = option(
        (0.004, 0.01, 0.03), above=0, below=1, help="training fractions in (0, 1), a comma list"
    )


KEYS = ("seq_acc", "token_acc", "train_seq_acc", "train_loss")
GROUPS = ("op", "train_fraction", "method")


def plot_mask(path: Path, task: ar.ArithmeticTask, config: ArithmeticConfig) -> None:
    """The op's mask prior M: queries down, keys across, answer digits named by place (c0 = units); a row is
    the query that predicts the token after it."""
    places = range(ar.OPERAND_DIGITS - 1, -1, -1)
    prompt = [f"a{p}" for p in places] + [task.op] + [f"b{p}" for p in places] + ["="]
    plots.plot_matrices(
        {f"{task.op}, {task.answer_format} answer: M": mask_logits(task, get_method("mask"), config)},
        path,
        [*prompt, *[f"c{p}" for p in task.answer_places()]],
        columns=1,
    )


class ArithmeticStudy(Study):
    """Every (op, training fraction, method) is one group over its seeds."""

    name = "arithmetic"
    title = "Low-data arithmetic study"
    description = "Low-data arithmetic study: python -m experiments.arithmetic --seeds=8 --ops=add,mul"
    config_type = ArithmeticConfig
    scope_type = ArithmeticScope
    presets = PRESETS
    default_seeds = 8
    default_methods = ("vanilla", "mask")
    figures = "seq_acc.png, mask_*.png"

    def resolve_methods(self, names: Sequence[str], config: ArithmeticConfig, scope: ArithmeticScope) -> list[Method]:
        return resolve(scope.ops, names, config.answer_format)[1]

    def make_data(self, config: ArithmeticConfig, scope: ArithmeticScope, log) -> list[ar.ArithmeticTask]:
        return resolve(scope.ops, [], config.answer_format)[0]

    def groups(self, plan: Plan) -> list[Group]:
        return [
            Group({"op": task.op, "train_fraction": fraction, "method": method.name}, (task, fraction, method))
            for task in plan.data
            for fraction in plan.scope.train_fractions
            for method in plan.methods
        ]

    def train(self, plan: Plan, group: Group, log, checkpoints, resume: bool):
        task, fraction, method = group.items
        return run_group(task, method, fraction, plan.seeds, plan.config, log, checkpoints, resume), {}

    def summary(self, plan: Plan, records: list[dict], reference: list[dict]) -> tuple[str, str]:
        table = tables.summary_table(records, KEYS, GROUPS)
        return f"{table}\n{tables.per_seed_table(records, 'seq_acc', GROUPS)}", table

    def plot(self, plan: Plan, records: list[dict], reference: list[dict], maps) -> None:
        for task in plan.data:
            if any(r["op"] == task.op for r in records):
                plot_mask(plan.out / f"mask_{task.op}.png", task, plan.config)
        plots.plot_curves(records, plan.out / "seq_acc.png", x="train_fraction", y="seq_acc", panel="op", line="method")


STUDY = ArithmeticStudy()
