"""Atomic file writes, without JAX: a child that only draws figures imports this and not the runtime."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _publish(tmp: str, path: Path) -> None:
    """Give the temp file the mode a plain open() would have (mkstemp makes it 0600), then rename it."""
    os.chmod(tmp, 0o666 & ~_umask())
    os.replace(tmp, path)


@contextlib.contextmanager
def replacing(path: Path, suffix: str = ".tmp") -> Iterator[str]:
    """A temp file's name beside `path`, renamed onto `path` when the block ends without error and removed
    when it raises: a reader sees the old file or the new one, never a torn one."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=suffix)
    os.close(fd)
    try:
        yield tmp
        _publish(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)


def write_bytes(path: Path, data: bytes) -> None:
    """`data` onto `path` atomically, flushed to disk before the rename."""
    with replacing(path) as tmp, open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
