"""The sweep runner's folder rules: what --overwrite does to old results, config.json's layout (and older
folders'), names that would collide, and checkpoint timing decided once for every host."""

import json

import jax
import numpy as np
import pytest

from maskjax import runner, store
from maskjax.checkpoint import SweepCheckpoints
from maskjax.errors import ConfigError
from maskjax.study import Group


def spec(method: str, value: float, fail: bool = False) -> runner.GroupSpec:
    def train(checkpoints, resume):
        if fail:
            raise KeyboardInterrupt  # the new sweep is interrupted inside this group
        return [{"method": method, "seed": 0, "value": value}]

    return runner.GroupSpec(method, {"method": method}, 1, train)


def sweep(out, config, specs, control):
    write = lambda out, records: store.write_jsonl(out / "results.jsonl", records)  # noqa: E731
    return runner.run_sweep(out, config, specs, write, control, lambda message: None)


def test_overwrite_sets_the_old_results_aside_so_a_later_resume_cannot_adopt_them(tmp_path):
    out = tmp_path / "out"
    sweep(out, {"lr": 1}, [spec("vanilla", 1.0), spec("mask", 1.0)], runner.RunControl())
    with pytest.raises(KeyboardInterrupt):  # the new config's run stops before its first group is written
        sweep(out, {"lr": 2}, [spec("vanilla", 2.0, fail=True), spec("mask", 2.0)], runner.RunControl(overwrite=True))
    resumed = sweep(out, {"lr": 2}, [spec("vanilla", 2.0), spec("mask", 2.0)], runner.RunControl(resume=True))
    assert [r["value"] for r in resumed] == [2.0, 2.0], "a resume adopted the replaced sweep's records"
    (aside,) = (out / runner.REPLACED).iterdir()
    assert [r["value"] for r in store.read_jsonl(aside / "results.jsonl")] == [1.0, 1.0]  # kept, not lost


def test_config_json_nests_config_scope_and_derived_and_older_flat_folders_still_resume(tmp_path):
    nested = {
        "study": "s",
        "methods": ["vanilla"],
        "seeds": [0],
        "scope": {"tasks": ["t"]},
        "config": {"steps": None, "lr": 1},
        "derived": {"steps": {"t": 10}},
    }
    out = tmp_path / "out"
    sweep(out, nested, [spec("vanilla", 1.0)], runner.RunControl())
    held = json.loads((out / "config.json").read_text())
    assert held["config"]["steps"] is None and held["derived"]["steps"] == {"t": 10}  # neither shadows the other
    assert store.sweep_config(held) == {"steps": None, "lr": 1}
    # A folder written before the nesting holds the flat merge; resuming it with this code still works.
    flat = {**runner.flat_sweep_record(nested), "environment": held["environment"]}
    assert flat["steps"] == {"t": 10} and store.sweep_config(flat) is flat
    (out / "config.json").write_text(json.dumps(flat))
    assert sweep(out, nested, [spec("vanilla", 1.0)], runner.RunControl(resume=True))[0]["value"] == 1.0
    changed = {**nested, "config": {"steps": None, "lr": 2}}
    with pytest.raises(runner.SweepError, match="different config"):
        sweep(out, changed, [spec("vanilla", 1.0)], runner.RunControl(resume=True))


def test_groups_whose_names_print_alike_are_refused_in_words():
    runner.check_group_names([Group({"task": "a", "method": "b"}, None), Group({"task": "a", "method": "c"}, None)])
    with pytest.raises(ConfigError, match="would both be named 'a_b_c'"):
        runner.check_group_names(
            [Group({"task": "a_b", "method": "c"}, None), Group({"task": "a", "method": "b_c"}, None)]
        )
    with pytest.raises(ConfigError, match="would both be named"):
        runner.check_group_names([Group({"fraction": 0.1234567}, None), Group({"fraction": 0.1234568}, None)])


def test_time_based_checkpoints_follow_process_zeros_clock(tmp_path, monkeypatch):
    from jax.experimental import multihost_utils

    checkpoints = SweepCheckpoints(tmp_path / "c", {}, every_seconds=1e9)  # this host's clock: not due
    every_steps = SweepCheckpoints(tmp_path / "d", {}, every_steps=10)
    asked = []

    def process_zero_decides(value):
        asked.append(bool(value))
        return np.asarray(True)

    monkeypatch.setattr(jax, "process_count", lambda: 2)
    monkeypatch.setattr(multihost_utils, "broadcast_one_to_all", process_zero_decides)
    assert checkpoints.due(10, 5) and asked == [False]
    # whole-step counts agree on every host without asking
    assert every_steps.due(10, 5) and not every_steps.due(19, 10) and asked == [False]


def test_a_bug_while_restoring_keeps_its_traceback(tmp_path, monkeypatch):
    from maskjax.train import RunState

    state = RunState({"w": np.ones(2, np.float32)}, {}, {"mu": np.zeros(2, np.float32)}, jax.random.key(0))
    checkpoints = SweepCheckpoints(tmp_path / "c", {"lr": 1})
    checkpoints.save(5, state, {"loss": np.zeros((1, 5))})

    def bug(*args):
        raise TypeError("a bug, not a damaged file")

    monkeypatch.setattr(SweepCheckpoints, "_check_fits", bug)
    with pytest.raises(TypeError, match="a bug"):
        checkpoints.restore_latest(state)


def test_a_folder_written_before_a_config_field_existed_resumes_at_its_default(tmp_path):
    """Adding a field to a study's config keeps its folders resumable while the field is at its default."""
    import dataclasses

    from maskjax.runner import RunControl, run
    from maskjax.studies import boolean

    out = tmp_path / "o"
    first = run(boolean.STUDY, "test", out, methods=["vanilla"], seeds=[0], log=lambda m: None)
    held = json.loads((out / "config.json").read_text())
    del held["config"]["row_policy"]  # as a folder written before the field was added holds it
    (out / "config.json").write_text(json.dumps(held))
    again = run(boolean.STUDY, "test", out, methods=["vanilla"], seeds=[0], control=RunControl(resume=True))
    assert again.records == first.records
    other = dataclasses.replace(boolean.STUDY.preset("test"), row_policy="members")
    with pytest.raises(runner.SweepError, match="holds a run of a different config"):
        run(boolean.STUDY, other, out, methods=["vanilla"], seeds=[0], control=RunControl(resume=True))


def test_same_sweep_in_the_nested_and_the_flat_form():
    wanted = {"study": "s", "methods": ["m"], "seeds": [0], "scope": {}, "config": {"a": 1, "new": 2}, "derived": {}}
    nested_old = {**wanted, "config": {"a": 1}}
    flat_old = {"study": "s", "methods": ["m"], "seeds": [0], "a": 1}
    for held in (nested_old, flat_old):
        assert runner.same_sweep(held, wanted, {"new": 2}) and not runner.same_sweep(held, wanted, {"new": 3})
        assert not runner.same_sweep(held, wanted, {})
    assert runner.same_sweep(wanted, wanted, {})


def test_a_model_field_added_since_a_folder_was_written_keeps_it_resumable_at_its_default():
    wanted = {"study": "s", "methods": ["m"], "seeds": [0], "scope": {}, "derived": {}}
    wanted["config"] = {"a": 1, "model": {"dim": 8, "path": "auto"}}
    held = {**wanted, "config": {"a": 1, "model": {"dim": 8}}}
    defaults = {"a": 0, "model": {"dim": 256, "path": "auto"}}
    assert runner.same_sweep(held, wanted, defaults)
    assert not runner.same_sweep(held, {**wanted, "config": {"a": 1, "model": {"dim": 8, "path": "x"}}}, defaults)
    assert not runner.same_sweep(held, {**wanted, "config": {"a": 1, "model": {"dim": 9, "path": "auto"}}}, defaults)
    from maskjax.studies import boolean

    assert runner.field_defaults(boolean.STUDY.preset("test"))["model"]["attention_impl"] == "auto"
