import json

import pytest

from maskjax import tables


def test_fisher_and_sign_tests_match_hand_computed_values():
    # 3/8 against 0/8: the tables as or more extreme have hypergeometric mass 0.1 on each side.
    assert tables.fisher_p(3, 8, 0, 8) == pytest.approx(0.2)
    assert tables.fisher_p(4, 8, 4, 8) == pytest.approx(1.0)
    # 7 of 8 pairs one way: 2 * (C(8,7) + C(8,8)) / 2**8.
    assert tables.sign_test_p([1.0] * 7 + [-1.0]) == pytest.approx(18 / 256)
    assert tables.sign_test_p([0.0, 0.0]) == 1.0 and tables.sign_test_p([1.0, 0.0]) == pytest.approx(1.0)


def run(task, method, seed, acc):
    return {"task": task, "method": method, "seed": seed, "acc_all": acc, "diverged": acc is None}


RECORDS = [
    *[run("majority3", "vanilla", s, 0.875) for s in range(8)],
    *[run("majority3", "mask", s, 1.0 if s < 3 else 0.875) for s in range(8)],
]
MDI = [{"task": "majority3", "method": "mdi", "acc_all": 0.875}]


def test_count_table_counts_seeds_above_the_mdi_with_fishers_test_against_vanilla():
    table = tables.count_table(RECORDS, MDI)
    assert "| majority3 | vanilla | 8 | 8/8 | 0/8 | 0/8 | - |" in table
    assert "| majority3 | mask | 8 | 8/8 | 3/8 | 3/8 | 1 / 0.2 / 0.2 |" in table


def test_per_seed_table_has_a_column_per_seed_and_marks_diverged_runs():
    records = [*RECORDS[:8], run("majority3", "mask", 0, None)]
    table = tables.per_seed_table(records, "acc_all", ("task", "method"))
    assert "| task | method | seed 0 | seed 1 |" in table
    assert "| majority3 | vanilla | 87.50 | 87.50 |" in table
    assert "| majority3 | mask | diverged | - |" in table


def write(folder, records):
    folder.mkdir()
    (folder / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def test_summarize_merges_folders_and_refuses_the_same_run_twice(cli, main, tmp_path):
    write(tmp_path / "a", [{**r, "git_commit": "aaaaaaa1"} for r in RECORDS[:8]])
    write(tmp_path / "b", [{**r, "git_commit": "bbbbbbb2"} for r in RECORDS[8:]])
    out = tmp_path / "summary.md"
    result = cli("experiments.summarize", str(tmp_path / "a"), str(tmp_path / "b"), f"--out={out}")
    assert result.returncode == 0, result.stderr
    page = out.read_text()
    assert "commit aaaaaaa" in page and "commit bbbbbbb" in page
    assert "| majority3 | mask | 8 | 8/8 | 3/8 | 3/8 | 1 / 0.2 / 0.2 |" in page and "| majority3 | mdi |" in page
    again = main("experiments.summarize", str(tmp_path / "a"), str(tmp_path / "a"), f"--out={out}")
    assert again.returncode == 2 and "twice" in again.stderr and "Traceback" not in again.stderr
    missing = main("experiments.summarize", str(tmp_path / "nope"), f"--out={out}")
    assert missing.returncode == 2 and "does not exist" in missing.stderr


def test_compare_reports_equal_and_differing_runs_and_strict_fails_on_a_difference(main, tmp_path):
    write(tmp_path / "old", RECORDS)
    changed = [dict(r) for r in RECORDS]
    changed[9]["acc_all"] = 0.5
    write(tmp_path / "new", changed)
    same = main("experiments.compare", str(tmp_path / "old"), str(tmp_path / "old"), "--keys=acc_all", "--strict")
    assert same.returncode == 0 and "| majority3 | mask | 8 | 8/8, 0 |" in same.stdout
    differ = main("experiments.compare", str(tmp_path / "old"), str(tmp_path / "new"), "--keys=acc_all", "--strict")
    assert differ.returncode == 1 and "| majority3 | mask | 8 | 7/8, 0.5 |" in differ.stdout
    older = [{k: v for k, v in r.items() if not (k == "acc_all" and r["seed"] < 3)} for r in RECORDS]
    write(tmp_path / "older", older)
    lacking = main("experiments.compare", str(tmp_path / "older"), str(tmp_path / "old"), "--keys=acc_all", "--strict")
    assert lacking.returncode == 0, lacking.stderr
    assert "| majority3 | mask | 8 | 5/5, 0; 3 without it (older records) |" in lacking.stdout


def test_persistence_pairs_each_run_with_the_mask_of_the_same_seed(main, tmp_path):
    def drifted(method, seed, value):
        return {"task": "2parity", "method": method, "seed": seed, "attention_drift": [[0.0], [value]]}

    records = [drifted("mask", s, 0.02) for s in range(8)] + [drifted("qk_svd", s, 0.1 + s) for s in range(8)]
    write(tmp_path / "run", records)
    result = main("experiments.persistence", str(tmp_path / "run"))
    assert result.returncode == 0, result.stderr
    assert "| 2parity | diagonal | adam | - | qk_svd | 8 | 8/8 | 0.00781 |" in result.stdout


def test_persistence_pairs_within_a_row_policy_and_refuses_a_run_twice(main, tmp_path):
    def drifted(method, seed, value, policy):
        return {"task": "majority3", "method": method, "seed": seed, "attention_drift": [[0.0], [value]],
                "config": {"row_policy": policy}}

    write(tmp_path / "diagonal", [drifted("mask", s, 0.5, "diagonal") for s in range(4)])
    write(tmp_path / "cls_all", [drifted("mask", s, 0.01, "cls_all") for s in range(4)]
          + [drifted("mask_random", s, 0.1, "cls_all") for s in range(4)])
    result = main("experiments.persistence", str(tmp_path / "cls_all"), str(tmp_path / "diagonal"))
    assert result.returncode == 0, result.stderr
    assert "| majority3 | cls_all | adam | - | mask_random | 4 | 4/4 | 0.125 |" in result.stdout
    twice = main("experiments.persistence", str(tmp_path / "cls_all"), str(tmp_path / "cls_all"))
    assert twice.returncode == 2 and "twice" in twice.stderr and "Traceback" not in twice.stderr


def test_paired_table_counts_wins_in_the_direction_that_is_better():
    from maskjax import tables

    records = [{"corpus": "c", "method": m, "seed": s, "test_ppl": v}
               for m, values in {"mask": [10.0, 12.0, 9.0], "vanilla": [11.0, 13.0, 8.0]}.items()
               for s, v in enumerate(values)]
    higher = tables.paired_table(records, "test_ppl", "mask", ("corpus",))
    lower = tables.paired_table(records, "test_ppl", "mask", ("corpus",), lower_is_better=True)
    assert "| c | vanilla | -0.333 | 1 / 2 / 0 | 1 |" in higher
    assert "| c | vanilla | -0.333 | 2 / 1 / 0 | 1 |" in lower and "lower is better" in lower


def test_paired_table_with_several_keys_gives_one_row_per_key_and_method():
    from maskjax import tables

    records = [{"method": m, "seed": s, "drift.0": v, "drift.1": 2 * v}
               for m, values in {"mask": [0.1, 0.2, 0.3], "vanilla": [0.2, 0.1, 0.4]}.items()
               for s, v in enumerate(values)]
    table = tables.paired_table(records, ["drift.0", "drift.1"], "mask", (), lower_is_better=True)
    assert "| key | method | mask - method (mean) | wins / losses / ties | sign test p |" in table
    assert "| drift.0 | vanilla | -0.0333 | 2 / 1 / 0 | 1 |" in table
    assert "| drift.1 | vanilla | -0.0667 | 2 / 1 / 0 | 1 |" in table
    assert "(drift.0, drift.1, lower is better)" in table


def test_paired_table_compares_one_method_across_source_folders():
    from maskjax import tables

    records = [{"source": src, "method": "qk_opt", "seed": s, "seq_acc": v}
               for src, values in {"scale1": [0.5, 0.6, 0.2], "scale5": [0.1, 0.2, 0.3]}.items()
               for s, v in enumerate(values)]
    table = tables.paired_table(records, "seq_acc", "scale1", ("method",), across="source")
    assert "| method | source | scale1 - source (mean) | wins / losses / ties | sign test p |" in table
    assert "| qk_opt | scale5 | +23.3 | 2 / 1 / 0 | 1 |" in table and "scale1 against each source" in table


def test_paired_table_is_empty_when_no_seed_pairs_the_reference_and_a_page_says_so(tmp_path):
    """A folder with one method (the title groups run one per folder) has nothing to pair: the summary leaves
    the table out rather than print a header with no rows; a results page asking for it gets one clear error."""
    from maskjax import pages
    from maskjax.errors import ConfigError

    alone = [{"corpus": "c", "method": "qk_svd", "seed": s, "test_ppl": 10.0 + s} for s in range(3)]
    assert tables.paired_table(alone, "test_ppl", "mask", ("corpus",)) == ""
    with pytest.raises(ConfigError, match="no seed pairs mask with another method on test_ppl"):
        pages._paired(alone, {"key": "test_ppl", "reference": "mask", "by": "corpus"}, tmp_path)
