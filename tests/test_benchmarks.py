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


def test_train_step_benchmark_refuses_a_bad_dtype(main):
    result = main("benchmarks.train_step", "--preset=test", "--dtype=float8")
    assert result.returncode == 2 and result.stderr.strip().startswith("error:") and "float8" in result.stderr


def test_attention_impl_benchmark_prints_a_ratio_per_length(main):
    result = main("benchmarks.attention_impl", "--lengths=8", "--batch=1", "--heads=2", "--head-dim=4", "--repeats=1")
    assert result.returncode == 0, result.stderr
    assert "| length | einsum s | fused s | einsum / fused |" in result.stdout
    assert result.stdout.strip().splitlines()[-1].startswith("| 8 |")


def test_language_step_benchmark_prints_a_row_per_method_and_batch(main):
    result = main(
        "benchmarks.language_step", "--preset=test", "--seeds=1", "--methods=mask", "--steps=2", "--repeats=1"
    )
    assert result.returncode == 0, result.stderr
    rows = [line for line in result.stdout.splitlines() if line.startswith("| mask |")]
    assert len(rows) == 1 and float(rows[0].split("|")[3]) > 0
