import json
import os
import signal
import subprocess
import sys

import numpy as np
import pytest
from conftest import ROOT, run_cli

from maskjax import store

ARGS = [
    "--preset=test",
    "--seeds=2",
    "--tasks=2parity",
    "--methods=vanilla,mask",
    "--steps=40",
    "--checkpoint-every=10",
]
# resumed_at_step differs by design: it says which steps a record's batch_seconds cover.
VOLATILE = {"batch_seconds", "git_commit", "devices", "resumed_at_step"}


def records(out, method=None):
    """The records of out without the fields that differ between identical runs, by method and seed;
    with `method`, that method's only and without the sweep's config (which names the methods run)."""
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    if method is not None:
        rows = [{k: v for k, v in r.items() if k != "config"} for r in rows if r["method"] == method]
    return sorted(
        ({k: v for k, v in r.items() if k not in VOLATILE} for r in rows), key=lambda r: (r["method"], r["seed"])
    )


@pytest.fixture(scope="module")
def whole(tmp_path_factory):
    """The uninterrupted run that every interrupted Boolean run here is compared with."""
    out = tmp_path_factory.mktemp("resume") / "whole"
    result = run_cli("experiments.boolean", *ARGS, f"--out={out}")
    assert result.returncode == 0, result.stderr
    return out


def start(out, *extra, module="experiments.boolean", args=ARGS):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", module, *args, f"--out={out}", *extra]
    return subprocess.Popen(command, cwd=ROOT, env=env, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)


def kill_after(process, line_part):
    seen = []
    for line in process.stderr:
        seen.append(line)
        if line_part in line:
            process.send_signal(signal.SIGKILL)
            process.wait()
            return seen
    raise AssertionError("never saw " + repr(line_part) + ":\n" + "".join(seen))


def test_sigkill_then_resume_equals_an_uninterrupted_run(cli, tmp_path, whole):
    killed = tmp_path / "killed"
    kill_after(start(killed), "mask checkpoint saved at step 30")
    assert (killed / "results.jsonl").exists()  # the finished vanilla batch was kept
    resumed = cli("experiments.boolean", *ARGS, f"--out={killed}", "--resume")
    assert resumed.returncode == 0, resumed.stderr
    assert "vanilla: already in" in resumed.stderr and "mask resumed at step 30/40" in resumed.stderr
    assert "group 2 of 2: 2parity_mask, 2 runs" in resumed.stderr and "steps/s, ETA" in resumed.stderr
    assert records(killed) == records(whole)
    resumed_at = {r["method"]: r["resumed_at_step"] for r in store.read_jsonl(killed / "results.jsonl")}
    assert resumed_at == {"vanilla": None, "mask": 30}
    assert {r["resumed_at_step"] for r in store.read_jsonl(whole / "results.jsonl")} == {None}
    # The attention plot of the resumed call is drawn from the maps of both batches, not only the one it trained.
    assert sorted(p.name for p in (killed / "maps").iterdir()) == ["2parity_mask.npz", "2parity_vanilla.npz"]


def test_a_corrupt_newest_checkpoint_falls_back_to_the_previous(cli, tmp_path, whole):
    killed = tmp_path / "killed"
    kill_after(start(killed, "--methods=mask"), "checkpoint saved at step 30")
    newest = killed / "checkpoints" / "2parity_mask" / "30"
    for path in newest.rglob("*"):
        if path.is_file():
            path.write_bytes(b"torn")
    resumed = cli("experiments.boolean", *ARGS, "--methods=mask", f"--out={killed}", "--resume")
    assert resumed.returncode == 0, resumed.stderr
    assert "checkpoint at step 30 is unreadable" in resumed.stderr
    assert "resumed at step 20/40" in resumed.stderr
    assert records(killed, "mask") == records(whole, "mask")


def test_a_resume_with_no_readable_checkpoint_stops_and_keeps_finished_results(cli, tmp_path):
    killed = tmp_path / "killed"
    kill_after(start(killed), "mask checkpoint saved at step 20")
    kept = (killed / "results.jsonl").read_text()
    for path in (killed / "checkpoints" / "2parity_mask").rglob("*"):
        if path.is_file():
            path.write_bytes(b"torn")
    resumed = cli("experiments.boolean", *ARGS, f"--out={killed}", "--resume")
    last = resumed.stderr.strip().splitlines()[-1]
    assert resumed.returncode == 2 and last.startswith("error: no checkpoint in") and "(steps 20, 10)" in last
    assert "ERROR:absl" not in resumed.stderr and "Traceback" not in resumed.stderr
    assert (killed / "results.jsonl").read_text() == kept  # the finished vanilla batch is still there


def test_contrast_sigkill_then_resume_equals_an_uninterrupted_run(cli, tmp_path):
    args = ["--preset=test", "--seeds=2", "--open=2,10", "--closed=-10", "--steps=40", "--checkpoint-every=10"]
    whole, killed = tmp_path / "whole", tmp_path / "killed"
    assert cli("experiments.contrast", *args, f"--out={whole}").returncode == 0
    kill_after(start(killed, module="experiments.contrast", args=args), "checkpoint saved at step 20")
    resumed = cli("experiments.contrast", *args, f"--out={killed}", "--resume")
    assert resumed.returncode == 0, resumed.stderr
    assert "resumed at step 20/40" in resumed.stderr

    def by_run(r):
        return r["open_value"], r["seed"]

    assert sorted(records(killed), key=by_run) == sorted(records(whole), key=by_run)


def one_error_line(result, part):
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and lines[0].startswith("error:") and part in lines[0], (
        result.stderr
    )


def test_out_folder_rules(cli, main, tmp_path):
    out = tmp_path / "out"
    one_error_line(
        main("experiments.boolean", "--preset=test", "--seeds=1", f"--out={out}", "--resume"), "nothing to resume"
    )
    assert cli("experiments.boolean", "--preset=test", "--seeds=1", "--methods=vanilla", f"--out={out}").returncode == 0
    before = (out / "results.jsonl").read_text()
    again = ["--preset=test", "--seeds=1", "--methods=vanilla", f"--out={out}"]
    one_error_line(main("experiments.boolean", *again), "already holds 1 results of this config; pass --resume")
    held = json.loads((out / "config.json").read_text())
    held["environment"]["git_commit"] = "the-commit-it-first-ran-at"
    (out / "config.json").write_text(json.dumps(held))
    assert main("experiments.boolean", *again, "--resume").returncode == 0
    assert (out / "results.jsonl").read_text() == before
    assert json.loads((out / "config.json").read_text()) == held, "a resume rewrote the sweep's environment"
    other = ["--preset=test", "--seeds=2", "--methods=vanilla", f"--out={out}"]
    one_error_line(main("experiments.boolean", *other), "different config")
    one_error_line(main("experiments.boolean", *other, "--resume"), "different config")
    assert (out / "results.jsonl").read_text() == before
    assert cli("experiments.boolean", *other, "--overwrite").returncode == 0
    assert len((out / "results.jsonl").read_text().splitlines()) == 2


def test_killed_on_one_device_resumed_on_eight_gives_the_same_floats(tmp_path, whole):
    killed = tmp_path / "killed"
    args = [*ARGS[:3], "--methods=mask", *ARGS[4:]]
    kill_after(start(killed, args=args), "checkpoint saved at step 20")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "XLA_FLAGS": "--xla_force_host_platform_device_count=8"}
    resumed = subprocess.run(
        [sys.executable, "-m", "experiments.boolean", *args, f"--out={killed}", "--resume"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )
    assert resumed.returncode == 0, resumed.stderr
    assert "on 2 device(s)" in resumed.stderr and "resumed at step 20/40" in resumed.stderr
    assert "unreadable" not in resumed.stderr
    # The checkpointed part of the history comes back bit for bit; what the 8 devices compute after it
    # agrees with one device to float32 rounding, as any 8-device run does (test_cli_boolean).
    for a, b in zip(records(whole, "mask"), records(killed, "mask"), strict=True):
        assert b.keys() == a.keys() and b["acc_all"] == a["acc_all"] and b["acc_unseen"] == a["acc_unseen"]
        assert b["attention_drift"][:5] == a["attention_drift"][:5]
        for key in ("mse", "train_loss", "attention_drift", "pattern_drift"):
            np.testing.assert_allclose(np.asarray(b[key], float), np.asarray(a[key], float), rtol=1e-5, atol=1e-7)
