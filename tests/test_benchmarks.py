import json


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


def test_train_step_benchmark_refuses_a_bad_dtype(cli):
    result = cli("benchmarks.train_step", "--preset=test", "--dtype=float8")
    assert result.returncode == 2 and result.stderr.strip().startswith("error:") and "float8" in result.stderr
