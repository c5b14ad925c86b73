import dataclasses
import itertools
import json

import numpy as np
import pytest

from maskjax import discover, mask_patterns
from maskjax.methods import get_method
from maskjax.studies import boolean as study
from maskjax.tasks.boolean import PAPER_TASKS, TASKS, BooleanTask, cube, get_task


def brute_force_verdicts(points, values, n_bits):
    """The verdicts by dictionary lookups over explicit squares: an independent reference."""
    table = {tuple(int(v) for v in p): float(f) for p, f in zip(points, values, strict=True)}

    def flipped(x, *bits):
        return tuple(-v if i in bits else v for i, v in enumerate(x))

    def verdict(differences):
        if not differences:
            return discover.UNTESTED
        return discover.SHOWN if any(abs(d) > 1e-6 for d in differences) else discover.RULED_OUT

    bits = [
        verdict([f - table[flipped(x, j)] for x, f in table.items() if flipped(x, j) in table]) for j in range(n_bits)
    ]
    pairs = np.full((n_bits, n_bits), discover.RULED_OUT)
    for j, k in itertools.combinations(range(n_bits), 2):
        corners = [(x, flipped(x, j), flipped(x, k), flipped(x, j, k)) for x in table]
        seconds = [
            table[a] - table[b] - table[c] + table[d] for a, b, c, d in corners if all(p in table for p in (b, c, d))
        ]
        pairs[j, k] = pairs[k, j] = verdict(seconds)
    return np.array(bits), pairs


@pytest.mark.parametrize("seed", range(4))
def test_verdicts_match_a_brute_force_reference(seed):
    rng = np.random.default_rng(seed)
    points = cube(5)
    keep = rng.random(32) < 0.6
    values = rng.integers(-1, 2, 32) * (points[:, 0] * points[:, 3] + (seed % 2) * points[:, 1])
    evidence = discover.interaction_evidence(points[keep], values[keep])
    bits, pairs = brute_force_verdicts(points[keep], values[keep], 5)
    np.testing.assert_array_equal(evidence.bits, bits)
    np.testing.assert_array_equal(evidence.pairs, pairs)


@pytest.mark.parametrize("name", list(TASKS))
def test_the_training_set_yields_the_oracle_pattern_on_every_task(name):
    task = get_task(name)
    learned = discover.task_pattern(task)
    assert discover.recovery(learned, mask_patterns.group_pattern(task.n_bits, task.groups)) == {
        "recovered": True,
        "missing_pairs": 0,
        "extra_pairs": 0,
    }


def test_2parity_interaction_is_untested_and_stays_open():
    points = cube(15)
    seen = np.asarray(get_task("2parity").seen(points), bool)
    evidence = discover.interaction_evidence(points[seen], points[seen, 0] * points[seen, 1])
    assert evidence.pairs[0, 1] == discover.UNTESTED
    assert evidence.bits[0] == evidence.bits[1] == discover.SHOWN
    assert np.all(evidence.bits[2:] == discover.RULED_OUT)


def test_no_target_value_outside_the_training_set_is_read():
    """2Parity and its MDI (x0 + x1 - 1) agree on every seen point, so the data gives both one pattern."""
    parity = get_task("2parity")
    mdi = BooleanTask("mdi_of_2parity", 15, lambda x: x[..., 0] + x[..., 1] - 1, parity.seen, ((0,), (1,)))
    np.testing.assert_array_equal(discover.task_pattern(mdi), discover.task_pattern(parity))


def test_missing_data_only_opens_entries():
    points = cube(6)
    values = points[:, 0] * points[:, 1]
    full = discover.learned_pattern(points, values)
    sparse = discover.learned_pattern(points[::7], values[::7])
    assert np.all(sparse >= full)


@pytest.mark.parametrize(
    "points, values, message",
    [
        (np.zeros((4, 3)), np.zeros(4), r"\+-1"),
        (cube(3), np.zeros(5), "need points"),
        (np.concatenate([cube(2), cube(2)[:1]]), np.arange(5.0), "twice"),
    ],
)
def test_bad_training_sets_are_refused(points, values, message):
    with pytest.raises(ValueError, match=message):
        discover.interaction_evidence(points, values)


@pytest.mark.parametrize("name", PAPER_TASKS)
def test_mask_learned_starts_from_the_same_logits_as_the_oracle_mask(name):
    """Same logits and the same mask mode: the two methods are the same run, seed for seed."""
    task, config = get_task(name), study.STUDY.preset("test")
    np.testing.assert_array_equal(
        study.task_mask_logits(task, get_method("mask_learned"), config),
        study.task_mask_logits(task, get_method("mask"), config),
    )
    assert dataclasses.replace(
        get_method("mask_learned"),
        name="mask",
        mask_pattern="oracle",
        description="",
        studies=get_method("mask").studies,
    ) == (dataclasses.replace(get_method("mask"), description=""))


def test_discover_cli_end_to_end(cli, tmp_path):
    out = tmp_path / "d"
    result = cli("experiments.discover", "--seeds=2", "--tasks=2parity,majority5", "--fractions=1,0.05", f"--out={out}")
    assert result.returncode == 0, result.stderr
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert len(records) == 2 * 2 * 2
    assert all(
        {"recovered", "missing_pairs", "extra_pairs", "n_train", "git_commit", "config"} <= set(r) for r in records
    )
    assert all(r["recovered"] for r in records if r["train_fraction"] == 1.0)
    assert (out / "recovery.png").read_bytes()[:4] == b"\x89PNG"
    assert "| 2parity | 1.0 | 2 |" in (out / "summary.md").read_text()


@pytest.mark.parametrize(
    "args, message", [(["--fractions=0"], "(0, 1]"), (["--tasks=nope"], "unknown task"), (["--seeds=0"], "--seeds")]
)
def test_discover_cli_bad_input(main, tmp_path, args, message):
    result = main("experiments.discover", f"--out={tmp_path / 'o'}", *args)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and message in lines[0], result.stderr
