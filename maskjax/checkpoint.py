"""Orbax save / restore of a whole sweep batch: any pytree of run states, the step and the loss history.

Typed PRNG keys (any leaf) are stored as their raw key data and wrapped again on restore. Orbax writes
each checkpoint to a temporary folder and renames it when complete, so a kill mid-save leaves the
previous checkpoints intact; a newest checkpoint that still fails to read is reported and the one
before it used.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils

from maskjax.errors import ConfigError
from maskjax.sharding import to_host


class CheckpointError(ConfigError):
    """A checkpoint that cannot be used: written by another config, or none readable."""


@contextlib.contextmanager
def _absl_quiet() -> Iterator[None]:
    """Orbax logs its own traceback through absl on a failed read, which `restore_latest` reports itself in
    one line; quiet only while orbax reads, so the host program's absl logging is left as it was."""
    logger = logging.getLogger("absl")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(level)


def _is_key(leaf: Any) -> bool:
    return jax.dtypes.issubdtype(getattr(leaf, "dtype", None), jax.dtypes.prng_key)


def _to_saveable(state: Any, history: dict[str, np.ndarray]) -> dict[str, Any]:
    raw = jax.tree.map(lambda leaf: jax.random.key_data(leaf) if _is_key(leaf) else leaf, state)
    return {"state": raw, "history": history}


def _layout(state: Any) -> dict[str, list]:
    """Every leaf's path, shape and dtype: what a checkpoint must match to be restored into `state`."""
    leaves = jax.tree_util.tree_leaves_with_path(_to_saveable(state, {})["state"])
    return {jax.tree_util.keystr(path): [list(np.shape(leaf)), str(leaf.dtype)] for path, leaf in leaves}


def _layout_difference(saved: dict[str, list], wanted: dict[str, list]) -> str | None:
    for path in sorted(set(saved) | set(wanted)):
        old, new = saved.get(path, "nothing"), wanted.get(path, "nothing")
        if old != new:
            return f"{path or 'state'}: saved {old}, this run needs {new}"
    return None


def _rewrap_keys(raw: Any, like: Any) -> Any:
    """The restored tree with the leaves that are typed keys in `like` wrapped as keys again."""
    return jax.tree.map(lambda r, leaf: jax.random.wrap_key_data(r) if _is_key(leaf) else r, raw, like)


# What reading a damaged or half-written checkpoint raises (orbax and tensorstore: missing or truncated files,
# unparsable metadata). Anything else is a bug and keeps its traceback.
READ_ERRORS = (OSError, ValueError, KeyError, EOFError)


def _orbax():
    """orbax.checkpoint, imported on first use (0.1-0.15 s that a run too short to checkpoint does not need)."""
    import orbax.checkpoint

    return orbax.checkpoint


class SweepCheckpoints:
    """Checkpoints of one vmapped group under `directory`, the last `keep` kept.

    `fingerprint` is a JSON-able description of the config; restoring a checkpoint written
    with another fingerprint raises CheckpointError.
    """

    def __init__(
        self,
        directory: Path,
        fingerprint: dict,
        every_steps: int | None = None,
        every_seconds: float = 300.0,
        keep: int = 2,
    ):
        self.every_steps, self.every_seconds = every_steps, every_seconds
        self.last_save = time.monotonic()
        self.directory = Path(directory).absolute()
        self.fingerprint = json.loads(json.dumps(fingerprint, sort_keys=True, default=str))
        self.keep = keep

    @functools.cached_property
    def manager(self):
        """Orbax's manager, made (and orbax imported) when a checkpoint is first written or read: a run too
        short to save one never pays for either."""
        ocp = _orbax()
        options = ocp.CheckpointManagerOptions(max_to_keep=self.keep, enable_async_checkpointing=False, create=True)
        with _absl_quiet():
            return ocp.CheckpointManager(self.directory, options=options)

    def due(self, done: int, previous: int) -> bool:
        """Save after this chunk? Every `every_steps` steps if set, else once `every_seconds` have passed by
        process 0's clock, which every process follows: saving is collective, so hosts whose clocks
        disagreed would wait on each other for ever."""
        if self.every_steps is not None:
            return done // self.every_steps > previous // self.every_steps
        late = time.monotonic() - self.last_save >= self.every_seconds
        if jax.process_count() > 1:
            late = bool(multihost_utils.broadcast_one_to_all(np.asarray(late)))
        return late

    def save(self, step: int, state: Any, history: dict[str, np.ndarray]) -> None:
        """history: per name, what the batch has logged so far (losses, probes), runs first."""
        history = {name: np.asarray(v, np.float32) for name, v in history.items()}
        saveable = jax.tree.map(to_host, _to_saveable(state, history))
        shapes = {name: list(v.shape) for name, v in history.items()}
        meta = {"step": step, "fingerprint": self.fingerprint, "history_shapes": shapes, "layout": _layout(state)}
        ocp = _orbax()
        self.manager.save(
            step, args=ocp.args.Composite(state=ocp.args.StandardSave(saveable), meta=ocp.args.JsonSave(meta))
        )
        self.last_save = time.monotonic()

    def restore_latest(
        self, like: Any, log: Callable[[str], None] | None = None
    ) -> tuple[int, Any, dict[str, np.ndarray]] | None:
        """(step, state, history) from the newest readable checkpoint, or None if there is none; the state as
        host arrays shaped like `like`. A checkpoint of another config or layout raises CheckpointError; a
        file that fails to read falls back to the previous checkpoint, and when none is readable that is a
        CheckpointError too: a resumed batch never silently restarts from step 0."""
        ocp = _orbax()
        with _absl_quiet():
            self.manager.reload()
            steps = sorted(self.manager.all_steps(), reverse=True)
        for step in steps:
            try:
                with _absl_quiet():
                    meta = self.manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]
                    self._check_fits(step, meta, like)
                    history = {name: np.zeros(shape, np.float32) for name, shape in meta["history_shapes"].items()}
                    abstract = jax.tree.map(lambda a: np.empty(np.shape(a), a.dtype), _to_saveable(like, history))
                    restored = self.manager.restore(
                        step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract))
                    )["state"]
            except CheckpointError:
                raise
            except READ_ERRORS as e:  # an unreadable file: fall back to the previous checkpoint
                if log is not None:
                    reason = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
                    log(f"checkpoint at step {step} is unreadable ({reason}); trying the previous one")
                continue
            state = _rewrap_keys(restored["state"], like)
            return int(meta["step"]), state, {name: np.asarray(v) for name, v in restored["history"].items()}
        if steps:
            raise CheckpointError(
                f"no checkpoint in {self.directory} is readable (steps {', '.join(map(str, steps))}); remove that "
                "folder to train this batch from step 0 (finished batches are kept), or pass --overwrite"
            )
        return None

    def _check_fits(self, step: int, meta: dict, like: Any) -> None:
        where = self.directory / str(step)
        if meta["fingerprint"] != self.fingerprint:
            raise CheckpointError(f"checkpoint {where} was written by another config; use --overwrite or another --out")
        difference = _layout_difference(meta["layout"], _layout(like))
        if difference is not None:
            raise CheckpointError(f"checkpoint {where} does not fit this run ({difference}); use --overwrite")
