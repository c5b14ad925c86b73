import numpy as np
import pytest

from maskjax.tasks import arithmetic as ar


def test_every_pair_lands_once_and_the_split_is_deterministic_per_seed():
    train, held = ar.split(0.004, seed=3)
    assert len(train) == 4000 and len(train) + len(held) == 10**6
    assert np.array_equal(np.sort(np.concatenate([train, held])), np.arange(10**6))
    again, _ = ar.split(0.004, seed=3)
    other, _ = ar.split(0.004, seed=4)
    assert np.array_equal(train, again) and not np.array_equal(train, other)


@pytest.mark.parametrize("fraction", [0.0, 1.0, -0.1, 1.5])
def test_fractions_outside_the_open_interval_are_refused(fraction):
    with pytest.raises(ValueError, match=r"\(0, 1\)"):
        ar.split(fraction, seed=0)


def test_unknown_op_and_format_are_refused():
    with pytest.raises(ValueError, match="unknown op 'div'"):
        ar.ArithmeticTask("div")
    with pytest.raises(ValueError, match="unknown answer format"):
        ar.ArithmeticTask("add", "sideways")


@pytest.mark.parametrize("op, answer_format", [(o, f) for o in ("add", "mul") for f in ("reversed", "plain")])
def test_sequences_spell_the_right_answers(op, answer_format):
    task = ar.ArithmeticTask(op, answer_format)
    a, b = ar.operands()
    pick = np.random.default_rng(0).choice(len(a), 2000, replace=False)
    seqs = ar.sequences(task, a[pick], b[pick])
    assert seqs.shape == (2000, task.length) and seqs.dtype == np.int32
    expected = a[pick] + b[pick] if op == "add" else a[pick] * b[pick]
    np.testing.assert_array_equal(ar.decode_answer(task, seqs[:, ar.PROMPT :]), expected)
    np.testing.assert_array_equal(seqs[:, 3], ar.PLUS if op == "add" else ar.TIMES)
    np.testing.assert_array_equal(seqs[:, 7], ar.EQUALS)
    np.testing.assert_array_equal(seqs[:, :3] @ [100, 10, 1], a[pick])


def test_a_worked_sequence():
    seq = ar.sequences(ar.ArithmeticTask("add"), np.array([987]), np.array([65]))[0]
    assert seq.tolist() == [9, 8, 7, ar.PLUS, 0, 6, 5, ar.EQUALS, 2, 5, 0, 1]  # 1052, units first


def test_place_value_pattern_structure():
    add = ar.place_value_pattern(ar.ArithmeticTask("add"))
    assert add.shape == (12, 12) and add.diagonal().all() and not np.triu(add, 1).any()
    operand_columns = [0, 1, 2, 4, 5, 6]  # a2 a1 a0 b2 b1 b0
    # The query at '=' writes the units digit: it opens a0 and b0 only among the operands.
    assert [c for c in operand_columns if add[7, c]] == [2, 6]
    assert [c for c in operand_columns if add[8, c]] == [1, 2, 5, 6]  # tens: places <= 1
    assert all(add[9, c] for c in operand_columns)  # hundreds and above: everything
    mul = ar.place_value_pattern(ar.ArithmeticTask("mul"))
    assert mul.shape == (14, 14) and [c for c in operand_columns if mul[7, c]] == [2, 6]
    plain = ar.place_value_pattern(ar.ArithmeticTask("add", "plain"))
    assert all(plain[7, c] for c in operand_columns)  # the first digit written is the thousands
    assert [c for c in operand_columns if plain[10, c]] == [2, 6]  # the last scored query writes the units
