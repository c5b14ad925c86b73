"""Compare a CLI run's records with the golden ones a commit before a refactor wrote (tests/golden)."""

import json
import os
from pathlib import Path

import jax
import numpy as np

from maskjax import runs

GOLDEN = Path(__file__).parent / "golden"
IDENTITY = ("task", "op", "train_fraction", "method", "seed")
ENVIRONMENT = {"jax_version"}


VOLATILE = {"git_commit", "batch_seconds", "devices", "backend", "config", "resumed_at_step"}
# stored curves are rounded (runs.STORED_DECIMALS), so two floats 1e-5 apart can round one step apart
ROUNDING = 10.0**-runs.STORED_DECIMALS


def write_golden(records: list[dict], name: str) -> None:
    """Pin a CLI's records (set MASKJAX_WRITE_GOLDEN=NAME and run its test once): every field but the run's
    environment and timing, so a later refactor can prove it changed no number."""
    kept = [{k: v for k, v in r.items() if k not in VOLATILE} for r in records]
    (GOLDEN / f"{name}_test_preset.jsonl").write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in kept))


def assert_matches_golden(records: list[dict], name: str) -> None:
    """Every run has a golden record, and every field of it equals the run's: bit for bit under the JAX
    version, platform and XLA passes the golden file was written with, to 1e-5 relative (or one rounding
    step of a stored curve) under any other (conftest turns LLVM's passes off). A test may run a subset of
    the golden sweep: a run does not depend on its batch's neighbours."""
    if os.environ.get("MASKJAX_WRITE_GOLDEN") == name:
        write_golden(records, name)
    golden = {
        tuple(g.get(k) for k in IDENTITY): g
        for g in map(json.loads, (GOLDEN / f"{name}_test_preset.jsonl").read_text().splitlines())
    }
    exact = (
        all(g["jax_version"] == jax.__version__ for g in golden.values())
        and jax.default_backend() == "cpu"
        and "xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", "")
    )
    new = {tuple(r.get(k) for k in IDENTITY): r for r in records}
    assert len(new) == len(records) and new and set(new) <= set(golden), sorted(set(new) - set(golden))
    for identity, r in new.items():
        g = golden[identity]
        for field, value in g.items():
            if field in ENVIRONMENT:
                continue
            if exact or not isinstance(value, (float, list)):
                assert r[field] == value, (field, r[field], value)
            else:
                actual, expected = np.asarray(r[field], float), np.asarray(value, float)
                np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=ROUNDING)
