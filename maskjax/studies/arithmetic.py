"""The low-data arithmetic study: one (op, training fraction, method) is one vmapped group over its seeds.

Every seed draws its own training subset (`tasks.arithmetic.split`), so the data carries the runs
axis; runs with different fractions have training sets of different sizes and are separate batches.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from maskjax import mask_patterns, plots, qk_priors, runs, tables
from maskjax.errors import ConfigError
from maskjax.methods import Method, get_method
from maskjax.models.causal import CausalTransformer
from maskjax.models.layers import ModelConfig
from maskjax.optim import OptimizerConfig, TrainConfig
from maskjax.overrides import option
from maskjax.study import Group, Plan, Study, register
from maskjax.tasks import arithmetic as ar
from maskjax.train import Trained, TrainInputs, variables_of


@dataclasses.dataclass(frozen=True, kw_only=True)
class ArithmeticConfig(OptimizerConfig):
    """epochs over each run's training subset set the steps unless `steps` overrides them."""

    preset: str
    model: ModelConfig
    learning_rate: float = option(1e-3, above=0, help="peak learning rate (cosine decay)")
    batch_size: int = option(256, help="pairs per step (at most the training subset)")
    epochs: int = option(50, help="epochs over each training subset")
    steps: int | None = option(None, help="training steps, overriding the epochs")
    open_value: float = option(5.0, flag="open", help="mask logit of open entries")
    closed_value: float = option(-5.0, flag="closed", help="mask logit of closed entries")
    answer_format: str = option("reversed", choices=ar.FORMATS, help="answer digit order (reversed: units first)")
    eval_size: int = option(10_000, help="held-out pairs scored per seed")
    qk_position_scale: float = option(
        qk_priors.POSITION_SCALE, above=0, help="factor on the position embeddings under the QK-SVD and QK-opt priors"
    )

    def train_config(self, n_train: int) -> TrainConfig:
        batch = min(self.batch_size, n_train)
        steps = self.steps if self.steps is not None else self.epochs * (n_train // batch)
        return self.optimizer_config(steps, batch, self.learning_rate, schedule="cosine")


PRESETS: dict[str, ArithmeticConfig] = {
    "paper": ArithmeticConfig(preset="paper", model=ModelConfig(dim=256, depth=6, heads=4, head_dim=64, mlp_dim=256)),
    # Width / 4, depth / 3, the paper's optimizer, schedule, batch and epochs: minutes per batch on a CPU.
    "quick": ArithmeticConfig(
        preset="quick", model=ModelConfig(dim=64, depth=2, heads=4, head_dim=16, mlp_dim=64), eval_size=4096
    ),
    # The ladder's rung a128d4 with the paper's plain answers (docs/design.md, "Sizes that learn", issue 43):
    # the size at which the low-data claims are tested, by a floor in the paper's own vanilla regime.
    "medium": ArithmeticConfig(
        preset="medium",
        model=ModelConfig(dim=128, depth=4, heads=4, head_dim=32, mlp_dim=512),
        answer_format="plain",
        eval_size=4096,
    ),
    "test": ArithmeticConfig(
        preset="test",
        model=ModelConfig(dim=16, depth=1, heads=2, head_dim=8, mlp_dim=16),
        steps=10,
        chunk_steps=5,
        eval_size=64,
        qk_opt_steps=20,
    ),
}


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


class ArithmeticGroup(NamedTuple):
    """What one group trains: an op at a training fraction, by a method."""

    task: ar.ArithmeticTask
    fraction: float
    method: Method


class ArithmeticInputs(NamedTuple):
    """One group's training inputs (each run trains on its own subset), and what its records need."""

    inputs: TrainInputs
    model: CausalTransformer
    eval_data: jax.Array
    target: np.ndarray


def make_group(group: ArithmeticGroup, seeds: Sequence[int], config: ArithmeticConfig) -> ArithmeticInputs:
    """The one-run init and loss of (op, fraction, method), and every seed's key, training and evaluation
    sequences."""
    task, fraction, method = group
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
    inputs = TrainInputs(init_run, loss, runs.seed_keys(seeds), (), train_BNL, train_config, data_per_run=True)
    return ArithmeticInputs(inputs, model, eval_BNL, target)


# Seed 0's first training sequences, on which every run's layer-0 attention at init is held against the prior.
PATTERN_PROBES = 64


def record_group(
    group: ArithmeticGroup,
    seeds: Sequence[int],
    config: ArithmeticConfig,
    built: ArithmeticInputs,
    trained: Trained,
    started: float,
) -> list[dict]:
    """One record per seed of a trained (op, fraction, method) group: exact match by greedy decoding on its
    held-out pairs and on a sample of its training pairs."""
    task, fraction, method = group
    model, eval_BNL, train_BNL = built.model, built.eval_data, built.inputs.data
    final = trained.final

    def decode(tokens_BNL: np.ndarray) -> np.ndarray:
        """Each run's greedy answers to its own sequences, [runs, n, answer digits]."""
        return runs.evaluate_runs(
            lambda variables, chunk, filler: greedy_answers(model, variables, chunk[0], task.answer_digits),
            final,
            [tokens_BNL],
            config.eval_size,
            summed=False,
            data_per_run=True,
        )

    answers = decode(np.asarray(eval_BNL))
    truth = np.asarray(eval_BNL)[:, :, ar.PROMPT :]
    fit_BNL = training_sample(np.asarray(train_BNL), seeds, config.eval_size)
    fit_correct = decode(fit_BNL) == fit_BNL[:, :, ar.PROMPT :]
    answer_rows = slice(ar.PROMPT - 1, -1)  # the queries that write the answer: the rows the prior shapes
    pattern_error = runs.layer0_pattern_error(
        model, trained.initial, train_BNL[0, :PATTERN_PROBES], built.target, answer_rows
    )
    outcomes = runs.outcome_fields(trained, built.inputs.train_config, time.time() - started)
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
                "n_train": int(train_BNL.shape[1]),
                "eval_size": int(truth.shape[1]),
                "pattern_error_init": pattern_error[i],
                **outcomes[i],
            }
        )
        records[-1]["train_loss_fall"] = runs.loss_fall(records[-1])
    return records


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
    benchmark_scope = ArithmeticScope(ops=("mul",), train_fractions=(0.03,))

    def check_method(self, method: Method, config: ArithmeticConfig, scope: ArithmeticScope) -> None:
        for task in self.make_data(config, scope, lambda message: None):
            try:
                ar.mask_pattern(task, runs.mask_kind(method))
            except ConfigError as e:
                raise ConfigError(f"method {method.name!r}: {e}") from None

    def make_data(self, config: ArithmeticConfig, scope: ArithmeticScope, log) -> list[ar.ArithmeticTask]:
        return [ar.ArithmeticTask(op, config.answer_format) for op in scope.ops]

    def groups(self, plan: Plan) -> list[Group[ArithmeticGroup]]:
        return [
            Group(
                {"op": task.op, "train_fraction": fraction, "method": method.name},
                ArithmeticGroup(task, fraction, method),
            )
            for task in plan.data
            for fraction in plan.scope.train_fractions
            for method in plan.methods
        ]

    def build(self, config: ArithmeticConfig, spec: ArithmeticGroup, seeds: Sequence[int]) -> ArithmeticInputs:
        return make_group(spec, seeds, config)

    def record(self, config, spec: ArithmeticGroup, seeds, built: ArithmeticInputs, trained: Trained, started: float):
        return record_group(spec, seeds, config, built, trained, started), {}

    def summary(self, plan: Plan, records: list[dict], reference: list[dict]) -> tuple[str, str]:
        table = tables.summary_table(records, KEYS, GROUPS)
        return f"{table}\n{tables.per_seed_table(records, 'seq_acc', GROUPS)}", table

    def plot(self, plan: Plan, records: list[dict], reference: list[dict], maps) -> None:
        for task in plan.data:
            if any(r["op"] == task.op for r in records):
                plot_mask(plan.out / f"mask_{task.op}.png", task, plan.config)
        plots.plot_curves(records, plan.out / "seq_acc.png", x="train_fraction", y="seq_acc", panel="op", line="method")


STUDY = register(ArithmeticStudy())
