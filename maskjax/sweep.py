"""The study protocol and the one sweep runner every study CLI uses.

A study is a task, a model, a config and a thin CLI. What they all share lives here: presets by
name, one key per seed, a method's initial mask from the task's own patterns, the init that puts a
QK prior into a fresh model, the fields every record carries (divergence, the end-of-training loss,
the batch), and the runner: check the output folder, write config.json, skip the batches already
in results.jsonl, checkpoint each batch, append its records and rewrite the outputs atomically.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import jax
import jax.numpy as jnp
import numpy as np

from maskjax import priors, probes, qk_priors, store
from maskjax.checkpoint import SweepCheckpoints
from maskjax.errors import ConfigError
from maskjax.methods import Method
from maskjax.train import InitRun, TrainConfig, Trained, first_nonfinite_step, train

Config = TypeVar("Config")
Log = Callable[[str], None]
# A task's mask patterns: (kind, seed) -> boolean open matrix [N, N]; kinds as Method.mask_pattern.
Patterns = Callable[[str, int], np.ndarray]


class SweepError(ConfigError):
    """An output folder that cannot be used as asked (another config, nothing to resume)."""


def get_preset(presets: Mapping[str, Config], name: str) -> Config:
    if name not in presets:
        raise ConfigError(f"unknown preset {name!r}; known: {', '.join(presets)}")
    return presets[name]


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
    return np.asarray(priors.mask_logits(pattern, *values))


def prior_init(
    build: Callable[..., Any],
    method: Method,
    sample: jax.Array,
    pattern_HNN: jax.Array,
    target_HNN: jax.Array,
    qk_opt_steps: int,
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
        )
        return params, variables.get("constants", {})

    return init_run


def train_batch(
    batch: Any, label: str, log: Log | None, checkpoints: SweepCheckpoints | None, resume: bool, **options: Any
) -> Trained:
    """`train` on a study's batch: anything with init_run, loss, run_keys, run_masks (each run's initial M,
    the one per-run input every study passes), data and train_config. options go to `train` (probe,
    data_per_run, augment)."""
    return train(
        batch.init_run,
        batch.loss,
        batch.run_keys,
        (batch.run_masks,),
        batch.data,
        batch.train_config,
        log,
        label=label,
        checkpoints=checkpoints,
        resume=resume,
        **options,
    )


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


def mask_logits_of(model: Any, method: Method, variables: dict) -> jax.Array:
    """The mask logits M of every layer, [layers, heads, N, N], from params (learnable) or constants (fixed)."""
    collection = "params" if method.mask_mode == "learnable" else "constants"
    return jnp.stack([variables[collection][f"block_{i}"]["attn"]["mask_logits"] for i in range(model.config.depth)])


def seed_verdict(passed: Sequence[bool], share: float = 0.75) -> dict:
    """How many seeds pass a rule and whether at least `share` of them do (0.75: three of four; 1: every
    seed); no seeds never pass. The rules that name a preset (docs/design.md) all count this way."""
    seeds, count = len(passed), sum(passed)
    return {"seeds": seeds, "pass": count, "passes": seeds > 0 and count >= share * seeds}


def end_loss(losses_S: np.ndarray) -> float:
    """The training loss a run ends at: the mean of its last 5% of steps (at least one)."""
    return float(np.mean(losses_S[-max(1, losses_S.shape[0] // 20) :]))


LOSS_CURVE_POINTS = 20


def loss_curve(losses_S: np.ndarray, points: int = LOSS_CURVE_POINTS) -> tuple[list[int], list[float | None]]:
    """A run's training loss in `points` equal windows of steps, small enough for every record: each window's
    last step (1-based) and mean loss, to 6 digits (None where the window went non-finite)."""
    if not losses_S.shape[0]:
        return [], []
    windows = np.array_split(np.arange(losses_S.shape[0]), min(points, losses_S.shape[0]))
    means = [float(np.mean(losses_S[w])) for w in windows]
    return [int(w[-1]) + 1 for w in windows], [float(f"{m:.6g}") if np.isfinite(m) else None for m in means]


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
                "runs_in_batch": int(losses_RS.shape[0]),
                "batch_seconds": round(seconds, 2),
                "resumed_at_step": trained.resumed_at_step or None,
            }
        )
    return fields


@dataclasses.dataclass(frozen=True)
class RunControl:
    """How a sweep treats its output folder: checkpoint cadence, resume, overwrite."""

    checkpoint_every: int | None = None
    resume: bool = False
    overwrite: bool = False


@dataclasses.dataclass(frozen=True)
class BatchSpec:
    """One vmapped batch of a sweep. fields: the record fields all its runs share and that name it in
    results.jsonl (e.g. task and method); runs: how many records it writes; train(checkpoints, resume)
    trains it and returns its records."""

    name: str
    fields: dict[str, Any]
    runs: int
    train: Callable[[SweepCheckpoints, bool], list[dict]]

    def done_in(self, records: list[dict]) -> bool:
        return sum(all(r.get(k) == v for k, v in self.fields.items()) for r in records) == self.runs


def prepare_out(out: Path, config: dict, control: RunControl) -> list[dict]:
    """Check `out` against the config it holds; return the records a resumed run keeps.

    A folder with results of another config is refused unless overwrite, and so is one with results of
    this config unless resume or overwrite: a repeated command never replaces results silently. resume
    needs a folder written by the same config. `config` excludes the environment (commit, devices).
    """
    out = store.ensure_writable_dir(out)
    config_path, results_path = out / "config.json", out / "results.jsonl"
    held = None
    if config_path.exists():
        try:
            held = {k: v for k, v in json.loads(config_path.read_text()).items() if k != "environment"}
        except (OSError, json.JSONDecodeError):
            raise SweepError(f"{config_path} is unreadable; pass --overwrite to start afresh") from None
    same = held == json.loads(json.dumps(config, default=str))
    if control.resume and control.overwrite:
        raise SweepError("--resume and --overwrite exclude each other")
    if control.resume:
        if held is None:
            raise SweepError(f"nothing to resume in {out}: no config.json from an earlier run")
        if not same:
            raise SweepError(f"cannot resume: {out} holds a run of a different config")
        return store.read_jsonl(results_path) if results_path.exists() else []
    if held is not None and not same and not control.overwrite:
        raise SweepError(f"{out} holds results of a different config; pass --overwrite or choose another --out")
    held_records = store.read_jsonl(results_path) if results_path.exists() else []
    if held_records and not control.overwrite:
        raise SweepError(
            f"{out} already holds {len(held_records)} results of this config; pass --resume to continue it, "
            "--overwrite to replace it, or choose another --out"
        )
    if control.overwrite:
        remove_tree(out / "checkpoints")
    return []


def remove_tree(path: Path) -> None:
    """Remove a folder, from process 0 only: in a multi-host job every process runs the sweep, one writes."""
    if jax.process_index() == 0:
        shutil.rmtree(path, ignore_errors=True)


def open_sweep(out: Path, config: dict, control: RunControl) -> tuple[list[dict], dict]:
    """Prepare `out`, write its config.json; return (records kept from a resumed run, the metadata every
    new record carries: config, git commit, JAX version, devices)."""
    records = prepare_out(out, config, control)
    env = store.environment()
    store.write_atomic(out / "config.json", json.dumps({**config, "environment": env}, indent=2) + "\n")
    return records, {"config": config, **env}


def batch_checkpoints(out: Path, name: str, fingerprint: dict, control: RunControl) -> SweepCheckpoints:
    """Checkpoints of one batch under out/checkpoints/name; a fresh (not resumed) run clears old ones."""
    directory = out / "checkpoints" / name
    if not control.resume:
        remove_tree(directory)
    return SweepCheckpoints(directory, fingerprint, control.checkpoint_every)


PLOT_EVERY_SECONDS = 300.0


def run_sweep(
    out: Path,
    config: dict,
    batches: Sequence[BatchSpec],
    write: Callable[[Path, list[dict]], Any],
    control: RunControl,
    log: Log,
    plot: Callable[[list[dict]], None] | None = None,
    plot_every: float = PLOT_EVERY_SECONDS,
) -> list[dict]:
    """Train every batch not yet in out/results.jsonl, in order; after each, append its records (with the
    sweep's metadata) and call write(out, records). Returns all records.

    plot(records) draws every figure from the records so far: after a batch when the last drawing is at
    least plot_every seconds old (so a long sweep's figures stay current while short batches do not
    spend their time drawing), and at the end unless the last batch was just drawn, which also redraws a
    resumed folder with this code.
    """
    records, meta = open_sweep(out, config, control)
    plot = plot if jax.process_index() == 0 else None  # figures are files: process 0 draws them
    last_plot, drawn = time.monotonic(), None
    for k, spec in enumerate(batches, 1):
        if spec.done_in(records):
            log(f"{spec.name}: already in {out / 'results.jsonl'}, skipped")
            continue
        log(f"batch {k} of {len(batches)}: {spec.name}, {spec.runs} runs")
        checkpoints = batch_checkpoints(out, spec.name, {"config": config, "batch": spec.name}, control)
        batch = spec.train(checkpoints, control.resume)
        records += [{**r, **meta} for r in batch]
        write(out, records)
        remove_tree(checkpoints.directory)
        if plot is not None and time.monotonic() - last_plot >= plot_every:
            plot(records)
            last_plot, drawn = time.monotonic(), len(records)
    if plot is not None and records and drawn != len(records):
        plot(records)
    remove_tree(out / "checkpoints")
    return records
