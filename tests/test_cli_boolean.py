import json

import pytest
from conftest import run_cli
from golden_check import assert_matches_golden

KEYS = {"task", "method", "seed", "acc_all", "acc_unseen", "mse", "train_loss", "steps"}
META = {"config", "git_commit", "jax_version", "devices"}


def read_records(out):
    return [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def end_to_end(tmp_path_factory):
    """One test-preset sweep that several tests read: each CLI run compiles its programs afresh."""
    out = tmp_path_factory.mktemp("boolean") / "run"
    result = run_cli(
        "experiments.boolean",
        "--preset=test",
        "--seeds=2",
        "--tasks=2parity,threesym",
        "--methods=vanilla,mask",
        f"--out={out}",
    )
    return out, result


def test_end_to_end_at_test_preset(end_to_end):
    out, result = end_to_end
    assert result.returncode == 0, result.stderr
    records = read_records(out)
    assert len(records) == 2 * 2 * 2
    for r in records:
        assert KEYS | META <= set(r)
        assert 0.0 <= r["acc_all"] <= 1.0 and 0.0 <= r["acc_unseen"] <= 1.0
        assert ("pair_coefficient" in r) == (r["task"] == "2parity")  # only a parity of two bits has one
    assert {(r["task"], r["method"]) for r in records} == {
        (t, m) for t in ("2parity", "threesym") for m in ("vanilla", "mask")
    }
    summary = (out / "summary.md").read_text()
    assert "| 2parity | mdi | - | - | 75.00 |" in summary and "| threesym | mdi | - | - | 62.50 |" in summary
    assert "+-" in summary
    config = json.loads((out / "config.json").read_text())
    assert config["config"]["model"]["dim"] == 16 and config["seeds"] == [0, 1] and config["environment"]["jax_version"]
    assert {"dim", "depth", "heads", "head_dim", "mlp_dim", "dtype"} <= set(config["config"]["model"])
    # the config's own steps (None: the preset's epochs decide) and the steps derived per task both kept
    assert config["config"]["batch_size"] == 256 and config["derived"]["steps"] == {"2parity": 10, "threesym": 10}
    assert config["config"]["steps"] == 10 and config["scope"]["tasks"] == ["2parity", "threesym"]
    assert all(r["drift_steps"] == [0, 5, 10] and len(r["attention_drift"]) == 3 for r in records)
    for r in records:  # 10 steps: one window a step, the last one the end loss
        assert r["train_loss_steps"] == list(range(1, 11))
        assert r["train_loss_curve"][-1] == pytest.approx(r["train_loss"], rel=1e-5)
    pngs = ("accuracy.png", "attention_2parity.png", "attention_threesym.png", "drift_2parity.png", "loss_2parity.png")
    for png in pngs:
        assert (out / png).read_bytes()[:4] == b"\x89PNG"
    assert "2parity mask step 10/10" in result.stderr
    assert "| threesym | mask | 2 | 0 |" in result.stdout
    assert not any("mask_change_open_mean" in r for r in records if r["method"] == "vanilla")
    assert_matches_golden(records, "boolean")  # the study skeleton's refactor changed no number


@pytest.mark.parametrize(
    "args, message",
    [
        (["--tasks=nope"], "unknown task 'nope'"),
        (["--methods=vanilla,nope"], "unknown method 'nope'"),
        (["--seeds=0"], "--seeds"),
        (["--seeds=abc"], "--seeds"),
        (["--preset=huge"], "unknown preset 'huge'"),
        (["--row-policy=nope"], "unknown row policy"),
        (["--dtype=float16"], "--dtype"),
        (["--tasks=cyclic3", "--methods=mask_misspecified"], "mask_misspecified on cyclic3"),
        (["--optimizer=rmsprop"], "--optimizer"),
        (["--mask-weight-decay=-1"], "--mask-weight-decay"),
        (["--mask-weight-decay=nan"], "--mask-weight-decay"),
        (["--mask-weight-decay=abc"], "--mask-weight-decay"),
        (["--open=nan"], "--open"),
        (["--closed=-inf"], "--closed"),
        (["--seeds=4:2"], "--seeds"),
        (["--seeds=1,1"], "--seeds"),
        (["--learning-rate=inf"], "--learning-rate"),
    ],
)
def test_bad_input_gives_one_clear_line(main, tmp_path, args, message):
    result = main("experiments.boolean", "--preset=test", f"--out={tmp_path / 'o'}", *args)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and message in lines[0], result.stderr


def test_unwritable_out_is_refused(cli, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    for out in (blocker, blocker / "below"):
        result = cli("experiments.boolean", "--preset=test", "--seeds=1", f"--out={out}")
        assert result.returncode == 2 and "Traceback" not in result.stderr
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and "error:" in lines[0] and str(blocker) in lines[0], result.stderr
    assert blocker.read_text() == "not a folder"


def test_help_documents_the_flags(main):
    result = main("experiments.boolean", "--help")
    assert result.returncode == 0
    for flag in ("--seeds", "--tasks", "--methods", "--preset", "--out", "--steps"):
        assert flag in result.stdout


def test_cpu_devices_give_the_same_results_as_one(end_to_end, tmp_path):
    """The CLI's default (one CPU device per core, the runs sharded over them) and 8 fake devices, against
    one device."""
    default = [r for r in read_records(end_to_end[0]) if r["task"] == "2parity" and r["method"] == "mask"]
    args = ["--preset=test", "--seeds=2", "--methods=mask"]
    one_out, eight_out = tmp_path / "one", tmp_path / "eight"
    assert run_cli("experiments.boolean", *args, "--cpu-devices=1", f"--out={one_out}").returncode == 0
    env = {"XLA_FLAGS": "--xla_force_host_platform_device_count=8"}
    result = run_cli("experiments.boolean", *args, f"--out={eight_out}", env=env)
    assert result.returncode == 0, result.stderr
    one, eight = read_records(one_out), read_records(eight_out)
    assert len(eight[0]["devices"]) == 8 and len(one[0]["devices"]) == 1
    assert [r["seed"] for r in eight] == [r["seed"] for r in one] == [r["seed"] for r in default] == [0, 1]
    for a, b, c in zip(one, eight, default, strict=True):
        for key in ("acc_all", "acc_unseen", "mse", "train_loss"):
            assert b[key] == pytest.approx(a[key], rel=1e-5, abs=1e-7), key
            assert c[key] == pytest.approx(a[key], rel=1e-5, abs=1e-7), key


def test_qk_prior_methods_run_from_the_cli(cli, tmp_path):
    out = tmp_path / "qk"
    methods = "--methods=qk_svd,qk_opt,mimetic,qk_opt_qknorm"
    result = cli("experiments.boolean", "--preset=test", "--seeds=1", methods, f"--out={out}")
    assert result.returncode == 0, result.stderr
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert [r["method"] for r in records] == ["qk_svd", "qk_opt", "mimetic", "qk_opt_qknorm"]
    for r in records:
        assert 0.0 <= r["pattern_error_init"] <= 1.0 and 0.0 <= r["pattern_drift"] <= 1.0


def test_qk_svd_initialises_eight_runs_sharded_over_two_cpu_devices(cli, tmp_path):
    """jaxlib's CPU SVD blocks a thread of the host's shared pool while its batch runs on the others: one
    init program per device once left no thread free, and this command hung in 2 of 3 tries (2 cores)."""
    out = tmp_path / "svd"
    args = ("--preset=test", "--seeds=8", "--steps=2", "--tasks=2parity", "--methods=qk_svd", "--cpu-devices=2")
    result = cli("experiments.boolean", *args, f"--out={out}", timeout=300)
    assert result.returncode == 0, result.stderr
    records = read_records(out)
    assert [r["seed"] for r in records] == list(range(8)) and len(records[0]["devices"]) == 2


def test_optimizer_and_mask_weight_decay_reach_config_and_every_record(cli, tmp_path):
    out = tmp_path / "sgd"
    result = cli(
        "experiments.boolean",
        "--preset=test",
        "--seeds=2",
        "--methods=mask",
        "--optimizer=sgd",
        "--learning-rate=0.01",
        "--mask-weight-decay=0",
        f"--out={out}",
    )
    assert result.returncode == 0, result.stderr
    config = json.loads((out / "config.json").read_text())
    assert config["config"]["optimizer"] == "sgd" and config["config"]["mask_weight_decay"] == 0.0
    assert config["derived"]["train"]["2parity"]["optimizer"] == "sgd"
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert len(records) == 2
    for r in records:
        assert r["optimizer"] == "sgd" and r["mask_weight_decay"] == 0.0 and r["learning_rate"] == 0.01
        assert len(r["mask_change_open_mean"]) == len(r["drift_steps"])
