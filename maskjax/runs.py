"""What every study's runs share: one key per seed, a method's initial mask from the
task's own patterns, the init that puts a QK prior into a fresh model, the probes on a trained model, and
the fields every record carries (divergence, the end-of-training loss, the group it trained in)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from maskjax import executables, mask_patterns, probes, qk_priors, store
from maskjax.methods import Method
from maskjax.optim import TrainConfig
from maskjax.sharding import to_host
from maskjax.train import InitRun, RunState, Trained, first_nonfinite_step, variables_of

# A task's mask patterns: (kind, seed) -> boolean open matrix [N, N]; kinds as Method.mask_pattern.
Patterns = Callable[[str, int], np.ndarray]


def seed_keys(seeds: Sequence[int]) -> jax.Array:
    """One PRNG key per run, from its seed alone, so a run does not depend on its batch."""
    return jax.vmap(jax.random.key)(jnp.asarray(seeds, jnp.uint32))


def mask_kind(method: Method) -> str:
    """The kind of task pattern a method's mask is built from; the oracle's for no mask or a zero mask,
    whose shape is all they take from it."""
    return "oracle" if method.mask_pattern in ("none", "zero") else method.mask_pattern


def initial_mask_logits(patterns: Patterns, method: Method, seed: int, values: tuple[float, float]) -> np.ndarray:
    """The method's initial M [N, N] for one run: all zeros for the zero mask, otherwise the task's
    pattern of the method's kind at the (open, closed) values. Methods without a mask get the oracle's
    (the model ignores it), so every method of a study builds the same inputs."""
    pattern = patterns(mask_kind(method), seed)
    if method.mask_pattern == "zero":
        return np.zeros(pattern.shape, np.float32)
    return np.asarray(mask_patterns.mask_logits(pattern, *values))


def prior_init(
    build: Callable[..., Any],
    method: Method,
    sample: jax.Array,
    pattern_HNN: jax.Array,
    target_HNN: jax.Array,
    qk_opt_steps: int,
    position_scale: float = qk_priors.POSITION_SCALE,
    impulse_position_scale: float = qk_priors.IMPULSE_POSITION_SCALE,
) -> InitRun:
    """init_run(key, *mask_logits) for `train`: build(*mask_logits) initialised on `sample` from the run's
    key itself (so adding a method never changes the others), then the method's QK prior put into
    W_Q, W_K (`qk_priors.with_qk_prior`, drawn from fold_in(key, 1))."""

    def init_run(key: jax.Array, *mask_logits: jax.Array) -> tuple[dict, dict]:
        variables = build(*mask_logits).init(key, sample)
        params = qk_priors.with_qk_prior(
            variables["params"],
            jax.random.fold_in(key, 1),
            method.qk_init,
            pattern_HNN,
            target_HNN,
            opt_steps=qk_opt_steps,
            position_scale=position_scale,
            impulse_position_scale=impulse_position_scale,
        )
        return params, variables.get("constants", {})

    return init_run


def sown(model: Any, variables: dict, x: jax.Array, name: str) -> jax.Array:
    """What every block's attention sowed under `name` on the inputs x (blocks named block_{i} at the top
    of the model): [layers, batch, heads, tokens, tokens]."""
    _, state = model.apply(variables, x, mutable=["intermediates"])
    blocks = state["intermediates"]
    return jnp.stack([blocks[f"block_{i}"]["attn"][name][0] for i in range(model.config.depth)])


def attention_drift(model: Any, start: dict, variables: dict, x: jax.Array) -> jax.Array:
    """How far every layer's attention on the inputs x moved from where it started: the rows' total
    variation from `start`'s attention, averaged over inputs, heads and queries, [layers]. The drift probe
    the vision and language studies share."""
    now, then = sown(model, variables, x, "attention"), sown(model, start, x, "attention")
    return probes.row_total_variation(now, then).mean(axis=(1, 2, 3))


def layer0_pattern_error(
    model: Any, initial: RunState, x: jax.Array, target_HNN: np.ndarray, rows: slice = slice(None)
) -> list[float]:
    """Per run, how well the prior is in place at init: the mean total-variation distance of layer 0's
    attention rows (those `rows` selects) on the inputs x from the target's (0: the target; 1: disjoint)."""

    @jax.jit
    @jax.vmap
    def layer0(params, constants):
        return sown(model, variables_of(params, constants), x, "attention")[0]

    attention = to_host(layer0(initial.params, initial.constants)).astype(np.float64)
    return [float(0.5 * np.abs(a - target_HNN[None])[..., rows, :].sum(-1).mean()) for a in attention]


def mask_logits_of(model: Any, method: Method, variables: dict) -> jax.Array:
    """The mask logits M of every layer, [layers, heads, N, N], from params (learnable) or constants (fixed)."""
    collection = "params" if method.mask_mode == "learnable" else "constants"
    return jnp.stack([variables[collection][f"block_{i}"]["attn"]["mask_logits"] for i in range(model.config.depth)])


def seed_verdict(passed: Sequence[bool], share: float = 0.75) -> dict:
    """How many seeds pass a rule and whether at least `share` of them do (0.75: three of four; 1: every
    seed); no seeds never pass. The rules that name a preset (docs/design.md) all count this way."""
    seeds, count = len(passed), sum(passed)
    return {"seeds": seeds, "pass": count, "passes": seeds > 0 and count >= share * seeds}


def eval_chunks(arrays: Sequence[np.ndarray], eval_batch: int) -> tuple[tuple[jax.Array, ...], jax.Array | None]:
    """n examples as [chunks, size, ...] for `lax.map`, size = min(eval_batch, n). A last partial chunk is
    filled by repeating the last example, and the weights [chunks, size] (1 real, 0 filler) mark them; None
    when nothing was filled, so a split that eval_batch divides is scored exactly as before."""
    n = len(arrays[0])
    size = min(eval_batch, n)
    pad = -n % size
    chunks = tuple(
        jnp.asarray(np.concatenate([a, np.repeat(a[-1:], pad, 0)]) if pad else np.asarray(a)).reshape(
            -1, size, *np.shape(a)[1:]
        )
        for a in arrays
    )
    weights = jnp.asarray((np.arange(n + pad) < n).astype(np.float32).reshape(-1, size)) if pad else None
    return chunks, weights


def evaluate_runs(
    score: Callable[..., Any],
    state: RunState,
    arrays: Sequence[np.ndarray],
    eval_batch: int,
    summed: bool = True,
    data_per_run: bool = False,
) -> Any:
    """Every run of a trained group scored on a whole split, eval_batch examples at a time: the one evaluator
    of every study (any split, any eval batch). The split is an argument of the compiled program, not a
    constant inside it (at CIFAR or ImageNet-100 size a constant slows the compile and bloats the cache).

    score(variables, chunk, filler) sees one chunk (a tuple of arrays [size, ...]) and filler, the weights
    [size] of a last partial chunk's repeated examples (0) or None. summed: score returns a tree of sums over
    the chunk, and the result is each sum over the split, [runs]; otherwise score returns per-example outputs
    [size, ...] and the result is them [runs, n, ...], filler dropped. data_per_run: each array carries the
    runs axis first (each run its own split). Results are on the host."""
    if data_per_run:
        n = np.shape(arrays[0])[1]
        by_example, filler = eval_chunks([np.moveaxis(np.asarray(a), 0, 1) for a in arrays], eval_batch)
        chunks = tuple(jnp.moveaxis(c, 2, 0) for c in by_example)
    else:
        n = len(arrays[0])
        chunks, filler = eval_chunks(arrays, eval_batch)

    def one_run(params, constants, chunks, filler):
        variables = variables_of(params, constants)
        out = jax.lax.map(lambda batch: score(variables, *batch), (chunks, filler))
        if summed:
            return jax.tree.map(lambda s: s.sum(0), out)
        return jax.tree.map(lambda a: a.reshape(-1, *a.shape[2:])[:n], out)

    runs = executables.jit(jax.vmap(one_run, in_axes=(0, 0, 0 if data_per_run else None, None)))
    return jax.tree.map(to_host, runs(state.params, state.constants, chunks, filler))


def end_loss(losses_S: np.ndarray) -> float:
    """The training loss a run ends at: the mean of its last 5% of steps (at least one)."""
    return float(np.mean(losses_S[-max(1, losses_S.shape[0] // 20) :]))


LOSS_CURVE_POINTS = 20
# curves and profiles in a record are stored to this many decimals: enough for every table, small files
STORED_DECIMALS = 6


def stored_curves(curves: Mapping[str, np.ndarray], run: int) -> dict[str, list]:
    """One run's probe curves (each [runs, probes, ...]) as the record stores them."""
    return {name: np.round(series[run].astype(np.float64), STORED_DECIMALS).tolist() for name, series in curves.items()}


def loss_curve(losses_S: np.ndarray, points: int = LOSS_CURVE_POINTS) -> tuple[list[int], list[float | None]]:
    """A run's training loss in `points` equal windows of steps, small enough for every record: each window's
    last step (1-based) and mean loss, to 6 digits (None where the window went non-finite)."""
    if not losses_S.shape[0]:
        return [], []
    windows = np.array_split(np.arange(losses_S.shape[0]), min(points, losses_S.shape[0]))
    means = [float(np.mean(losses_S[w])) for w in windows]
    return [int(w[-1]) + 1 for w in windows], [float(f"{m:.6g}") if np.isfinite(m) else None for m in means]


def loss_fall(record: dict) -> float | None:
    """Relative fall of the training loss over the last tenth of the steps: from the window mean nearest 90%
    of the steps to the last window's; None without a finite curve."""
    curve, steps = record.get("train_loss_curve"), record.get("train_loss_steps")
    if not curve or None in curve:
        return None
    start = int(np.argmin(np.abs(np.asarray(steps, np.float64) - 0.9 * steps[-1])))
    return (curve[start] - curve[-1]) / curve[start]


def record_train_config(record: dict) -> TrainConfig:
    """The schedule and decay a run trained with, read from its record (for `optim.decay_only_change`).
    Records carry weight_decay, schedule and warmup_steps since issue 44; an older record gives them through
    its config: the Boolean study trained at a constant rate, the others with cosine decay after a warmup of
    warmup_fraction of the steps (as the vision and language configs' train_config computes it)."""
    steps = int(record["steps"])
    config = store.sweep_config(record.get("config") or {})
    if "schedule" in record:
        schedule, warmup, decay = record["schedule"], record["warmup_steps"], record["weight_decay"]
    else:
        boolean = (record.get("config") or {}).get("study") == "boolean"
        schedule, decay = "constant" if boolean else "cosine", config["weight_decay"]
        warmup = int(config.get("warmup_fraction", 0.0) * steps)
    return TrainConfig(
        steps,
        learning_rate=record["learning_rate"],
        weight_decay=decay,
        optimizer=record["optimizer"],
        schedule=schedule,
        mask_weight_decay=record.get("mask_weight_decay"),
        warmup_steps=warmup,
    )


def outcome_fields(
    trained: Trained, config: TrainConfig, seconds: float, failed: np.ndarray | None = None
) -> list[dict]:
    """Per run, what every study records about its training: the end loss (None once diverged) and the
    coarse loss curve, whether and where the loss went non-finite (`failed` adds runs whose outputs did),
    the schedule and the batch it shared. batch_seconds is this process's time: after a resume it covers
    only the steps from resumed_at_step, so it is not the run's cost."""
    losses_RS = trained.losses
    diverged_at = first_nonfinite_step(losses_RS)
    fields = []
    for i in range(losses_RS.shape[0]):
        diverged = bool(diverged_at[i]) or bool(failed is not None and failed[i])
        curve_steps, curve = loss_curve(losses_RS[i])
        fields.append(
            {
                "train_loss": None if diverged else end_loss(losses_RS[i]),
                "train_loss_steps": curve_steps,
                "train_loss_curve": curve,
                "diverged": diverged,
                "diverged_at_step": int(diverged_at[i]) or None,
                "steps": int(config.steps),
                "learning_rate": config.learning_rate,
                "optimizer": config.optimizer,
                "mask_weight_decay": config.mask_weight_decay,
                "weight_decay": config.weight_decay,
                "schedule": config.schedule,
                "warmup_steps": config.warmup_steps,
                "runs_in_batch": int(losses_RS.shape[0]),
                "batch_seconds": round(seconds, 2),
                "resumed_at_step": trained.resumed_at_step or None,
            }
        )
    return fields
