import atexit
import importlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# One compilation cache for the whole session, shared with every CLI subprocess: the tests compile the
# same test-preset programs many times, and compiling, not training, is most of their time.
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="maskjax-jax-cache-")
    atexit.register(shutil.rmtree, os.environ["JAX_COMPILATION_CACHE_DIR"], True)
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
# The test-preset programs are tiny and run for milliseconds; LLVM's optimisation passes are most of
# their compile time. Without them a float32 result moves by ~1e-7 relative (the ops are the same;
# only codegen differs), so every comparison between two runs of the suite stays exact and the
# golden records, written with the default passes, are compared to 1e-5 (golden_check).
if "xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} --xla_backend_optimization_level=0".strip()

# The test processes themselves keep JAX's one CPU device, whichever test first calls a CLI's main in
# process (which would otherwise give the worker one device per core, `maskjax.runtime`); CLI
# subprocesses start afresh and take the CLIs' defaults.
import jax  # noqa: E402

jax.devices()


def run_cli(module: str, *args: str, timeout: int = 600, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run `python -m module args` from the repository root, as a user would; env adds variables."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", module, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )


@pytest.fixture
def cli():
    return run_cli


@pytest.fixture
def main(capsys):
    """Run a CLI's main in this process as `python -m module args` would, returning the same
    CompletedProcess fields: for input the CLI must refuse, where a subprocess would spend its
    seconds importing JAX. Each CLI also keeps a subprocess test of its real exit path."""
    from experiments.cli import run_main

    def run(module: str, *args: str) -> subprocess.CompletedProcess:
        capsys.readouterr()
        try:
            code = run_main(importlib.import_module(module).main, list(args))
        except SystemExit as e:  # --help, and argparse in the CLIs that do not raise UserError
            code = e.code
        captured = capsys.readouterr()
        return subprocess.CompletedProcess([module, *args], code, captured.out, captured.err)

    return run
