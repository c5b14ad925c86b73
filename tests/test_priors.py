import numpy as np
import pytest

from maskjax import mask_patterns


@pytest.mark.parametrize("policy", list(mask_patterns.ROW_POLICIES))
@pytest.mark.parametrize("groups", [((0, 1),), ((0, 1, 2),), tuple((i, (i + 1) % 15, (i + 2) % 15) for i in range(15))])
def test_every_row_keeps_an_open_entry(policy, groups):
    pattern = mask_patterns.group_pattern(15, groups, policy)
    assert pattern.shape == (16, 16)
    assert pattern.any(axis=1).all()


def test_2parity_diagonal_pattern():
    pattern = mask_patterns.group_pattern(15, ((0, 1),))
    # Tokens: 0 = CLS, 1 = x0, 2 = x1.
    assert pattern[1, 2] and pattern[2, 1] and pattern[1, 1] and pattern[2, 2]
    assert list(np.flatnonzero(pattern[0])) == [0, 1, 2]
    for t in range(3, 16):
        assert list(np.flatnonzero(pattern[t])) == [t]
    members = mask_patterns.group_pattern(15, ((0, 1),), "members")
    assert list(np.flatnonzero(members[0])) == [1, 2] and list(np.flatnonzero(members[7])) == [1, 2]
    assert mask_patterns.group_pattern(15, ((0, 1),), "cls_all")[0].all()


def test_mask_logits_values_and_bad_input():
    logits = np.asarray(mask_patterns.mask_logits(np.eye(3, dtype=bool), 10.0, -10.0))
    np.testing.assert_array_equal(logits, np.where(np.eye(3), 10.0, -10.0))
    with pytest.raises(ValueError, match="row policy"):
        mask_patterns.group_pattern(3, ((0, 1),), "nope")
    with pytest.raises(ValueError, match="outside"):
        mask_patterns.group_pattern(3, ((0, 5),))


@pytest.mark.parametrize("groups", [((0, 1),), ((0, 1, 2),)])
def test_misspecified_pattern_keeps_the_sparsity_and_avoids_the_oracle_pairs(groups):
    moved = mask_patterns.misspecified_groups(15, groups)
    for policy in mask_patterns.ROW_POLICIES:
        oracle = mask_patterns.group_pattern(15, groups, policy)
        placebo = mask_patterns.group_pattern(15, moved, policy)
        assert placebo.sum() == oracle.sum()
    assert not mask_patterns.interacting_pairs(moved) & mask_patterns.interacting_pairs(groups)
    assert mask_patterns.misspecified_groups(15, ((0, 1),)) == ((1, 2),)


def test_cyclic3_has_no_misspecified_placement():
    with pytest.raises(ValueError, match="no shift"):
        mask_patterns.misspecified_groups(15, tuple((i, (i + 1) % 15, (i + 2) % 15) for i in range(15)))


def test_random_pattern_matches_the_count_and_is_seeded():
    oracle = mask_patterns.group_pattern(15, ((0, 1),))
    a, b = mask_patterns.random_pattern(oracle, 0), mask_patterns.random_pattern(oracle, 1)
    assert a.sum() == b.sum() == oracle.sum()
    assert np.all(np.diag(a)) and a.any(axis=1).all()
    np.testing.assert_array_equal(a, mask_patterns.random_pattern(oracle, 0))
    assert not np.array_equal(a, b)


def test_each_mask_method_starts_from_its_own_logits():
    from maskjax.methods import get_method
    from maskjax.runs import initial_mask_logits

    oracle = mask_patterns.group_pattern(15, ((0, 1),))
    patterns = {"oracle": oracle, "random": mask_patterns.random_pattern(oracle, 3)}

    def initial(name):
        return initial_mask_logits(lambda kind, seed: patterns[kind], get_method(name), 3, (10.0, -10.0))

    np.testing.assert_array_equal(initial("mask_zero"), np.zeros((16, 16)))
    for name in ("mask", "mask_fixed", "vanilla"):
        np.testing.assert_array_equal(initial(name), np.where(oracle, 10.0, -10.0))
    np.testing.assert_array_equal(initial("mask_random"), np.where(patterns["random"], 10.0, -10.0))
