import dataclasses
import json

import pytest

from maskjax.methods import get_method
from maskjax.studies import boolean as study
from maskjax.tasks.boolean import get_task

CONFIG = dataclasses.replace(study.STUDY.preset("test"), steps=8, chunk_steps=4)


def test_a_grid_run_equals_the_same_run_alone():
    task, method = get_task("2parity"), get_method("mask")
    values = [(o, c) for o in (0.5, 10.0) for c in (-0.5, -10.0)]
    grid, _ = study.STUDY.run(CONFIG, study.BooleanGroup(task, method, tuple(values)), [0, 1, 2, 3])
    alone, _ = study.STUDY.run(CONFIG, study.BooleanGroup(task, method, tuple([values[2]])), [2])
    assert grid[2]["open_value"] == alone[0]["open_value"] == 10.0 and grid[2]["closed_value"] == -0.5
    for key in ("acc_all", "mse", "train_loss", "pattern_error_init"):
        assert alone[0][key] == pytest.approx(grid[2][key], rel=1e-4, abs=1e-6), key
    assert grid[0]["pattern_error_init"] != grid[3]["pattern_error_init"]


def test_contrast_cli_trains_the_grid_as_one_batch(cli, tmp_path):
    out = tmp_path / "c"
    result = cli(
        "experiments.contrast", "--preset=test", "--seeds=2", "--open=2,10", "--closed=-2,-5,-10", f"--out={out}"
    )
    assert result.returncode == 0, result.stderr
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert len(records) == 2 * 3 * 2
    assert {r["runs_in_batch"] for r in records} == {12}
    assert {(r["open_value"], r["closed_value"]) for r in records} == {(o, c) for o in (2, 10) for c in (-2, -5, -10)}
    for r in records:
        assert {"seed", "acc_all", "acc_unseen", "mse", "git_commit", "config"} <= set(r)
    assert (out / "contrast.png").read_bytes()[:4] == b"\x89PNG"
    assert "| 10.0 | -10.0 | 2 | 0 |" in (out / "summary.md").read_text()


@pytest.mark.parametrize(
    "args, message",
    [(["--open=abc"], "--open"), (["--method=vanilla"], "oracle mask"), (["--task=nope"], "unknown task")],
)
def test_contrast_bad_input(main, tmp_path, args, message):
    result = main("experiments.contrast", "--preset=test", f"--out={tmp_path / 'o'}", *args)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and message in lines[0], result.stderr
