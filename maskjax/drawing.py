"""Figures drawn by child interpreters, one per core, beside the run.

A study's CLI starts the children first (`start`), before it imports JAX: at a low priority they import
matplotlib and load its fonts on cores the parent leaves idle, and when the run ends they draw its figures
side by side instead of one after another in the parent. Inside `batch()` a call of a `drawn` function is
queued, and the batch's end hands the queue to the children and waits for every file. Without children
(a notebook, a test, a child that would not start) each figure is drawn where it is called. A figure a
child fails on, or does not finish because it died, is drawn again in the parent, so a bug raises there
with its own traceback.

The children import no JAX: `maskjax` loads its public names lazily, and `maskjax.plots` and
`maskjax.files` need only numpy and matplotlib.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import functools
import importlib.util
import io
import os
import pickle
import select
import signal
import struct
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

MAX_CHILDREN = 4
# A child that draws nothing for this long is taken to hang: it is ended and its figure drawn in the parent.
STALL_SECONDS = 600.0
_HEADER = struct.Struct("<Q")
_MAX_MESSAGE = 1 << 31  # a longer "message" is a corrupted pipe, not a job or an answer
_ROOT = str(Path(__file__).resolve().parent.parent)  # where the parent imported maskjax from


class _Child:
    def __init__(self) -> None:
        # The child imports maskjax from where the parent did: from a checkout not on its path, put first.
        code = (
            f"import sys; {_ROOT!r} in sys.path or sys.path.insert(0, {_ROOT!r}); "
            "from maskjax.drawing import serve; serve()"
        )
        # In a session of its own, the child is not sent the terminal's Ctrl-C: the parent reports that (and
        # ends the children), and a child that outlives the parent reads the end of its stdin and exits.
        self.process = subprocess.Popen(
            [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True
        )

    def send(self, message: bytes) -> None:
        _write(self.process.stdin, message)

    def receive(self) -> bool:
        """Whether the child drew its job (it failed on it if not). EOFError when the child died."""
        return pickle.loads(_read(self.process.stdout))

    def stop(self, busy: bool = False) -> None:
        """End the child: an idle one at once; a busy one (a batch interrupted) by SIGTERM first, which it turns
        into SystemExit, so the figure it was writing leaves no temp file behind."""
        if busy:
            self.process.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=5)
        self.process.kill()
        self.process.wait()
        for pipe in (self.process.stdin, self.process.stdout):
            with contextlib.suppress(OSError):
                pipe.close()


_children: list[_Child] = []
_queue: list[tuple] | None = None  # the open batch's calls: (function, args, kwargs)


def start(count: int | None = None) -> None:
    """Start `count` children (default: one per core this process may use, at most MAX_CHILDREN) unless
    some are running; where they cannot be started (no matplotlib, no POSIX pipes to select() on, no
    process to spare), figures are drawn in place."""
    if _children or os.name != "posix" or importlib.util.find_spec("matplotlib") is None:
        return
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    count = min(cores, MAX_CHILDREN) if count is None else count
    try:
        for _ in range(count):
            _children.append(_Child())
    except OSError:
        stop()


def stop() -> None:
    """End the children; a batch already finished has every file written, so nothing is lost."""
    while _children:
        _children.pop().stop()


atexit.register(stop)


def drawn(fn: Callable[..., None]) -> Callable[..., None]:
    """Queue calls of `fn` (a module-level function that writes a file and returns nothing; its arguments
    picklable) inside `batch()` while children run; call it in place otherwise."""

    @functools.wraps(fn)
    def queued(*args: Any, **kwargs: Any) -> None:
        if _queue is None or not _children:
            fn(*args, **kwargs)
        else:
            _queue.append((queued, args, kwargs))

    return queued


@contextlib.contextmanager
def batch() -> Iterator[None]:
    """Collect the `drawn` calls of the block, then draw them on the children and wait for every file."""
    global _queue
    if _queue is not None:  # nested: the outer batch draws
        yield
        return
    _queue = []
    try:
        yield
        jobs = _queue
    finally:
        _queue = None
    for fn, args, kwargs in _draw_on_children(jobs):
        fn(*args, **kwargs)


def _draw_on_children(jobs: list[tuple]) -> list[tuple]:
    """Hand each idle child the next job until all are drawn; return those to draw again in the parent (a
    job that does not pickle, one a child failed on, hung on or died drawing). Interrupted (Ctrl-C, an
    error), it ends the busy children, whose answers would otherwise answer a later batch's jobs."""
    waiting, busy, again = collections.deque(jobs), {}, []
    try:
        while waiting or busy:
            for child in [c for c in _children if c not in busy]:
                if not waiting:
                    break
                job = waiting.popleft()
                try:
                    message = pickle.dumps(job)
                except Exception:  # an argument that does not pickle: the parent draws it
                    again.append(job)
                    continue
                try:
                    child.send(message)
                    busy[child] = job
                except OSError:
                    again.append(job)
                    _drop(child)
            if not busy:
                break
            ready, _, _ = select.select([c.process.stdout for c in busy], [], [], STALL_SECONDS)
            for child in list(busy) if not ready else [c for c in busy if c.process.stdout in ready]:
                job = busy.pop(child)
                if not ready:  # stalled
                    again.append(job)
                    _drop(child, busy=True)
                    continue
                try:
                    if not child.receive():
                        again.append(job)
                except Exception:  # died, or wrote something that is not an answer
                    again.append(job)
                    _drop(child)
    except BaseException:
        for child in busy:
            _drop(child, busy=True)
        raise
    return again + list(waiting)


def _drop(child: _Child, busy: bool = False) -> None:
    child.stop(busy)
    if child in _children:
        _children.remove(child)


def _write(pipe: BinaryIO, payload: bytes) -> None:
    pipe.write(_HEADER.pack(len(payload)) + payload)
    pipe.flush()


def _read(pipe: BinaryIO) -> Any:
    header = pipe.read(_HEADER.size)
    if len(header) < _HEADER.size:
        raise EOFError
    (size,) = _HEADER.unpack(header)
    if size > _MAX_MESSAGE:
        raise EOFError(f"a message of {size} bytes: the pipe is corrupted")
    payload = pipe.read(size)
    if len(payload) < size:
        raise EOFError
    return payload


def serve() -> None:
    """The child: warm matplotlib up, then draw each job read from stdin and answer on stdout whether it was
    drawn, until stdin closes. Anything the figure code prints goes to stderr; a failure's traceback is
    the parent's to show, when it draws the job again."""
    jobs = sys.stdin.buffer
    # Answers go to a copy of fd 1; fd 1 itself (and sys.stdout) becomes stderr, so that nothing the figure
    # code or a library writes to stdout, from Python or from C, lands in the answers.
    answers = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # unwinds, so a half-written figure is removed
    with contextlib.suppress(OSError):
        os.nice(10)
    try:
        _warm_up()
    except ImportError:  # no matplotlib here: answer nothing, so the parent draws every figure itself
        return
    while True:
        try:
            fn, args, kwargs = pickle.loads(_read(jobs))
        except EOFError:
            return
        try:
            fn(*args, **kwargs)
            done = True
        except Exception:
            done = False
        _write(answers, pickle.dumps(done))


def _warm_up() -> None:
    """Import numpy and matplotlib and draw one small labelled figure, which loads the fonts."""
    import numpy  # noqa: F401  (the figure code's other import)
    from matplotlib.figure import Figure

    fig = Figure(figsize=(1.0, 1.0))
    fig.subplots().set_title("warm")
    fig.savefig(io.BytesIO(), format="png")
