"""Results files: records, maps, the environment a result ran in. Every file is written atomically."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from collections.abc import Iterable
from pathlib import Path

import jax
import numpy as np

from maskjax import files
from maskjax.errors import ConfigError, OutputFolderError


def write_atomic(path: Path, text: str) -> None:
    """Write to a temp file beside `path`, then rename: a reader sees the old file or the new, never a torn one.

    In a multi-host job only process 0 writes; every process holds the same gathered results.
    """
    if jax.process_index() != 0:
        return
    files.write_bytes(path, text.encode("utf-8"))


def write_jsonl(path: Path, records: Iterable[dict]) -> None:
    write_atomic(path, "".join(json.dumps(r, sort_keys=True) + "\n" for r in records))


def write_maps(path: Path, maps: dict[str, np.ndarray]) -> None:
    """Small named arrays a plot is drawn from (attention maps, masks of seed 0), in float16, atomically, so
    a resumed sweep can redraw the plots of batches it did not train itself. Only process 0 writes."""
    if jax.process_index() != 0:
        return
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with files.replacing(path, ".npz") as tmp:
        np.savez_compressed(tmp, **{k: np.asarray(v, np.float16) for k, v in maps.items()})


def read_maps(path: Path) -> dict[str, np.ndarray]:
    with np.load(path) as arrays:
        return {k: arrays[k].astype(np.float32) for k in arrays.files}


def read_jsonl(path: Path) -> list[dict]:
    """The records of a results file; a line that is not JSON is bad input, named by file and line."""
    records = []
    for number, line in enumerate(Path(path).read_text().splitlines(), 1):
        if line.strip():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise ConfigError(f"{path}:{number} is not a JSON record ({e.msg})") from None
    return records


def git_commit() -> str:
    """The commit of the code that ran, with '+dirty' when the tree has uncommitted changes."""
    root = Path(__file__).resolve().parent.parent
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"], cwd=root, capture_output=True, text=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return commit + ("+dirty" if dirty else "")


def environment() -> dict:
    """What a result needs beside its config to be reproduced: commit, JAX version, devices, the XLA flags
    (a study's CPU flags, or the user's; the floats may differ in the last digit under other flags)."""
    return {
        "git_commit": git_commit(),
        "jax_version": jax.__version__,
        "devices": [str(d) for d in jax.devices()],
        "backend": jax.default_backend(),
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
    }


def ensure_writable_dir(path: Path) -> Path:
    """Create `path` if needed and prove it takes files; raise OSError with a plain message if not. In a
    multi-host job only process 0 writes, so only it creates and checks the folder."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise OutputFolderError(f"output path {str(path)!r} exists and is not a directory")
    if jax.process_index() != 0:
        return path
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as e:
        raise OutputFolderError(f"output folder {str(path)!r} is not writable ({e.strerror or e})") from None
    return path


def is_nested(sweep: dict) -> bool:
    """Whether a config.json (or a record's `config` field) is the runner's nested form (`study`, `methods`,
    `seeds`, then `scope`, `config`, `derived`), not the flat merge older folders hold."""
    return isinstance(sweep.get("config"), dict) and isinstance(sweep.get("scope"), dict)


def sweep_config(sweep: dict) -> dict:
    """The study's config from a config.json (or a record's `config` field), nested or of an older folder."""
    return sweep["config"] if is_nested(sweep) else sweep
