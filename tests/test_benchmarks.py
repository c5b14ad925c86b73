import json
import time

import jax.numpy as jnp
import pytest

from benchmarks.step import seconds_per_step


def test_train_step_benchmark_prints_tables_and_a_json_line(cli):
    result = cli(
        "benchmarks.train_step", "--preset=test", "--seeds=1,2", "--steps=2", "--repeats=1", "--depths=1", "--no-torch"
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    summary = json.loads(lines[-1])
    assert [r["seeds"] for r in summary["seeds"]] == [1, 2]
    for row in summary["seeds"] + summary["depths"]:
        assert row["step_seconds"] > 0 and row["flops_per_step"] > 0 and row["flops_per_s"] > 0
    assert summary["seeds"][1]["flops_per_step"] > summary["seeds"][0]["flops_per_step"]
    assert summary["matmul_peak_flops"] > 0 and summary["devices"] and summary["git_commit"]
    assert "| seeds | s/step | seed-steps/s | vs sequential |" in result.stdout


def test_steps_cheaper_than_the_timers_noise_count_as_free_not_negative():
    """A chunk's fixed cost is timed on empty chunks; when an empty chunk times slower than a full one
    (tiny steps, one repeat), the step time is that fixed cost spread over the chunk, never below zero."""
    def chunk(state, data, start, n_steps):
        time.sleep(0.05 if int(n_steps) == 0 else 0.01)
        return state, jnp.zeros(1)

    seconds = seconds_per_step(chunk, None, None, steps=2, repeats=1, chunk_steps=10)
    assert 0.05 / 10 <= seconds < 0.05


def test_train_step_benchmark_refuses_a_bad_dtype(main):
    result = main("benchmarks.train_step", "--preset=test", "--dtype=float8")
    assert result.returncode == 2 and result.stderr.strip().startswith("error:") and "float8" in result.stderr


def test_attention_impl_benchmark_prints_a_ratio_per_length(main):
    result = main("benchmarks.attention_impl", "--lengths=8", "--batch=1", "--heads=2", "--head-dim=4", "--repeats=1")
    assert result.returncode == 0, result.stderr
    assert "| length | einsum s | fused s | manual s | einsum / fused | einsum / manual |" in result.stdout
    assert result.stdout.strip().splitlines()[-1].startswith("| 8 |")


@pytest.mark.parametrize("study", ["boolean", "arithmetic", "vision", "language"])
def test_step_benchmark_times_every_study(main, study):
    result = main(
        "benchmarks.step", f"--study={study}", "--preset=test", "--seeds=1,2", "--steps=2", "--repeats=1", "--no-torch"
    )
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["study"] == study and [r["seeds"] for r in summary["rows"]] == [1, 2]
    for row in summary["rows"]:
        assert row["step_seconds"] > 0 and row["flops_per_step"] > 0
        assert row["seed_steps_per_s"] == pytest.approx(row["seeds"] / row["step_seconds"])
    # Two runs cost twice one run's FLOPs, however many devices they are sharded over.
    one, two = summary["rows"]
    assert two["flops_per_step"] == pytest.approx(2 * one["flops_per_step"], rel=0.05)
    assert "| way | seeds | s/step |" in result.stdout and summary["matmul_peak_flops"] > 0
    if study == "language":  # a rung of a ladder is timed through --set: a wider model costs more
        wider = main(
            "benchmarks.step",
            "--study=language",
            "--preset=test",
            "--seeds=1",
            "--steps=2",
            "--repeats=1",
            "--no-torch",
            "--set",
            "model.mlp_dim=256",
        )
        assert wider.returncode == 0 and "set model.mlp_dim=256" in wider.stderr
        assert json.loads(wider.stdout.strip().splitlines()[-1])["rows"][0]["flops_per_step"] > one["flops_per_step"]


def test_step_benchmark_compares_device_counts_and_workers_in_their_own_processes(cli):
    result = cli(
        "benchmarks.step",
        "--study=boolean",
        "--preset=test",
        "--seeds=2",
        "--steps=2",
        "--repeats=1",
        "--compare=1,2",
        "--workers=2",
        "--no-torch",
    )
    assert result.returncode == 0, result.stderr
    rows = json.loads(result.stdout.strip().splitlines()[-1])["rows"]
    assert [(r["way"], r["devices"]) for r in rows] == [("1 device", 1), ("2 devices", 2), ("2 processes", 2)]


def test_step_benchmark_refuses_an_unknown_study_and_a_worker_count_that_divides_nothing(main):
    for args, expected in (
        (["--study=chess"], "chess"),
        (["--study=boolean", "--seeds=3", "--workers=2"], "--workers"),
        (["--study=vision", "--set", "patch=3"], "patch is not a field of VisionConfig"),
    ):
        result = main("benchmarks.step", *args)
        assert result.returncode == 2 and result.stderr.strip().startswith("error:") and expected in result.stderr


def test_tables_sets_every_row_against_the_earlier_commit_and_torch(main, tmp_path):
    def result(commit, rows, torch=None):
        rows = [
            {"way": way, "seeds": s, "devices": d, "step_seconds": t, "seed_steps_per_s": s / t, "flops_per_s": 5e9}
            for way, s, d, t in rows
        ]
        return {"git_commit": commit, "matmul_peak_flops": 1e11, "rows": rows, **({"torch": torch} if torch else {})}

    before, after = tmp_path / "before.txt", tmp_path / "after.txt"
    before.write_text("table\n" + json.dumps(result("aaaaaaa1", [("1 device", 1, 1, 0.02)])))
    torch = {"version": "2.x", "step_seconds": 0.01}
    after.write_text(json.dumps(result("bbbbbbb2", [("1 device", 1, 1, 0.01), ("2 devices", 8, 2, 0.04)], torch)))
    out = main("benchmarks.tables", str(before), str(after))
    assert out.returncode == 0, out.stderr
    rows = [line for line in out.stdout.splitlines() if line.startswith("| aaaaaaa") or line.startswith("| bbbbbbb")]
    assert rows[0].split(" | ")[5:7] == ["1.00x", "0.50x"]
    assert rows[2].split(" | ")[1:3] == ["2 devices", "8"] and rows[2].split(" | ")[5:7] == ["4.00x", "2.00x"]
    assert main("benchmarks.tables", str(tmp_path / "missing.txt"), str(after)).returncode == 2


def test_profile_names_the_kernels_of_a_traced_chunk(main):
    # Every kernel listed: at the test preset the epoch shuffle's kernels can be the slowest.
    result = main("benchmarks.profile", "--study=boolean", "--preset=test", "--steps=2", "--top=10000")
    assert result.returncode == 0, result.stderr
    assert "| kernel kind | ms/step | share |" in result.stdout
    kernel_rows = result.stdout.split("| kernel | ms/step |")[1].strip().splitlines()[2:]
    assert len(kernel_rows) > 10 and all(float(row.split(" | ")[1]) >= 0 for row in kernel_rows)
    assert any("GotuTransformer" in row and "block_0/attn" in row for row in kernel_rows)


@pytest.mark.parametrize("study", ["boolean", "arithmetic", "vision", "language"])
def test_every_study_has_a_pytorch_peer_that_runs(main, study):
    pytest.importorskip("torch", reason="the PyTorch peers need the bench extra (pip install -e '.[bench]')")
    result = main("benchmarks.step", f"--study={study}", "--preset=test", "--seeds=1", "--steps=2", "--repeats=1")
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["torch"]["step_seconds"] > 0 and summary["torch"]["version"].startswith("2.")
    assert "torch eager, 1 seed:" in result.stderr and "x |" in result.stdout  # the "vs torch" column is filled


def test_xla_flags_picks_a_candidate_only_when_it_is_faster_at_every_seed_count():
    from benchmarks.xla_flags import flag_list, pick

    default = {1: 10.0, 8: 80.0}
    timed = {"--a": {1: 8.0, 8: 78.0}, "--b": {1: 9.0, 8: 70.0}, "--c": {1: 5.0, 8: 90.0}}
    assert pick(default, timed, 0.05) == "--b"  # --a is 3% faster at 8 seeds, --c slower there
    assert pick(default, timed, 0.2) is None
    assert flag_list("--xla_a=1 --xla_b, --xla_c") == ["--xla_a=1 --xla_b", "--xla_c"]
    with pytest.raises(ValueError, match="expected XLA flags"):
        flag_list("-O3")


def test_xla_flags_times_each_flag_set_in_its_own_process(cli):
    result = cli(
        "benchmarks.xla_flags", "--studies=boolean", "--preset=test", "--seeds=1",
        "--candidates=--xla_cpu_use_onednn=false",
    )
    assert result.returncode == 0, result.stderr
    assert "| boolean | (defaults) |" in result.stdout and "| boolean | --xla_cpu_use_onednn=false |" in result.stdout
    assert json.loads(result.stdout.strip().splitlines()[-1])["picks"].keys() == {"boolean"}
