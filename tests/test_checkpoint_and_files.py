from pathlib import Path

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from maskjax import files, store
from maskjax.checkpoint import CheckpointError, SweepCheckpoints
from maskjax.train import RunState


def example_state(value: float) -> RunState:
    keys = jax.random.split(jax.random.key(3), 2)
    return RunState({"w": jnp.full((2, 3), value)}, {}, {"mu": jnp.zeros((2, 3))}, keys)


def test_save_restore_round_trip_keeps_the_last_two(tmp_path):
    checkpoints = SweepCheckpoints(tmp_path / "c", {"lr": 1.0}, every_steps=5)
    for step in (5, 10, 15):
        history = {"loss": np.full((2, step), step, np.float32), "drift": np.zeros((2, step // 5, 3), np.float32)}
        checkpoints.save(step, example_state(float(step)), history)
    assert sorted(p.name for p in (tmp_path / "c").iterdir()) == ["10", "15"]
    step, state, history = checkpoints.restore_latest(example_state(0.0))
    assert step == 15 and history["loss"].shape == (2, 15) and history["drift"].shape == (2, 3, 3)
    np.testing.assert_array_equal(history["loss"], 15.0)
    chex.assert_trees_all_equal(state.params, example_state(15.0).params)
    np.testing.assert_array_equal(jax.random.key_data(state.data_key), jax.random.key_data(example_state(0.0).data_key))
    assert checkpoints.due(10, 9) and not checkpoints.due(9, 6)


def test_a_checkpoint_from_another_config_is_refused(tmp_path):
    SweepCheckpoints(tmp_path / "c", {"lr": 1.0}).save(5, example_state(1.0), {"loss": np.zeros((2, 5))})
    with pytest.raises(CheckpointError, match="another config"):
        SweepCheckpoints(tmp_path / "c", {"lr": 2.0}).restore_latest(example_state(0.0))


def test_an_unreadable_checkpoint_leaves_the_hosts_absl_logging_as_it_was(tmp_path):
    import logging

    absl = logging.getLogger("absl")
    absl.setLevel(logging.INFO)
    checkpoints = SweepCheckpoints(tmp_path / "c", {"lr": 1.0})
    assert absl.level == logging.INFO  # building a checkpointer used to silence absl for the whole process
    checkpoints.save(5, example_state(1.0), {"loss": np.zeros((2, 5))})
    for item in (tmp_path / "c" / "5").rglob("*"):
        if item.is_file():
            item.write_bytes(b"garbage")
    logged = []
    with pytest.raises(CheckpointError, match="no checkpoint in .* is readable .steps 5.; remove that folder"):
        checkpoints.restore_latest(example_state(0.0), logged.append)
    assert "checkpoint at step 5 is unreadable" in logged[0] and absl.level == logging.INFO


def test_maps_are_written_by_process_zero_only(tmp_path, monkeypatch):
    monkeypatch.setattr(jax, "process_index", lambda: 1)
    store.write_maps(tmp_path / "m.npz", {"a": np.zeros(2)})
    store.write_atomic(tmp_path / "t.txt", "x")
    assert not list(tmp_path.iterdir())


def test_nothing_to_restore(tmp_path):
    assert SweepCheckpoints(tmp_path / "empty", {}).restore_latest(example_state(0.0)) is None


def test_atomic_write_keeps_the_old_file_when_writing_fails(tmp_path, monkeypatch):
    path = tmp_path / "results.jsonl"
    store.write_jsonl(path, [{"a": 1}])

    def broken_fsync(fd):
        raise OSError("disk full")

    monkeypatch.setattr(store.os, "fsync", broken_fsync)
    with pytest.raises(OSError, match="disk full"):
        store.write_jsonl(path, [{"a": 2}])
    assert store.read_jsonl(path) == [{"a": 1}]
    assert [p.name for p in tmp_path.iterdir()] == ["results.jsonl"]


def test_environment_names_the_checkouts_commit_and_the_devices(tmp_path, monkeypatch):
    import re
    import subprocess

    root = Path(store.__file__).resolve().parent.parent
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True)
    env = store.environment()
    assert env["devices"] == [str(d) for d in jax.devices()] and env["backend"] == jax.default_backend()
    if head.returncode == 0:  # a checkout: the commit that ran, marked when the tree differs from it
        assert re.fullmatch(head.stdout.strip() + r"(\+dirty)?", env["git_commit"]), env["git_commit"]
    # Without git (a wheel, a copied folder) the commit is said to be unknown, never an empty string.
    monkeypatch.setenv("PATH", str(tmp_path))
    assert store.git_commit() == "unknown"


def test_results_files_get_ordinary_permissions(tmp_path):
    path = tmp_path / "summary.md"
    store.write_atomic(path, "x")
    assert path.stat().st_mode & 0o777 == 0o666 & ~files._umask()
