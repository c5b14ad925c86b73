import numpy as np

from maskjax import priors
from maskjax import qk_priors as qp


def test_svd_qk_reproduces_the_target_on_the_pseudo_input():
    pattern = np.broadcast_to(priors.group_pattern(15, ((0, 1),)).astype(float), (2, 16, 16))
    positions = np.random.default_rng(0).normal(size=(16, 32))
    q, k = qp.svd_qk(pattern, positions, 16, seed=1)
    assert q.shape == k.shape == (32, 2, 16)
    np.testing.assert_allclose(np.linalg.norm(q[:, 0]), 7.0)
    attention = qp.softmax_logits(qp.layer_norm(positions), q, k)
    assert qp.pattern_error(attention, pattern) < 0.01
    q2, k2 = qp.svd_qk(pattern, positions, 16, seed=1)
    np.testing.assert_array_equal(q, q2)
    assert not np.array_equal(q, qp.svd_qk(pattern, positions, 16, seed=2)[0])


def test_mimetic_qk_is_the_truncated_svd_of_noise_plus_identity():
    q, k, a = qp.mimetic_factors(8, 2, 8, seed=0)
    np.testing.assert_allclose(np.einsum("dhe,fhe->hdf", q, k), a, atol=1e-12)
    noise = a - 0.7 * np.eye(8)
    assert np.abs(noise).max() <= 0.7 * np.sqrt(3 / 8) + 1e-12
    q, k, a = qp.mimetic_factors(8, 1, 3, seed=0)
    u, s, vt = np.linalg.svd(a[0])
    best = u[:, :3] @ np.diag(s[:3]) @ vt[:3]
    np.testing.assert_allclose(q[:, 0] @ k[:, 0].T, best, atol=1e-12)
    _, _, value_out = qp.mimetic_factors(8, 1, 8, seed=0, alpha=0.4, beta=0.4, sign=-1.0)
    assert np.trace(value_out[0]) < 0


def test_impulse_offsets_and_border_rows():
    grid = 3
    p = qp.impulse_patterns(grid, 10)
    assert p.shape == (10, 9, 9) and np.all(p.sum(-1) == 1)
    np.testing.assert_array_equal(p[0], np.eye(9))  # offset 4: the centre
    np.testing.assert_array_equal(p[9], p[0])  # head 9 wraps to the first offset
    # Head 1 uses offset 1: (dr, dc) = (-1, 0), one row up.
    assert p[1, 1 * grid + 1, 0 * grid + 1] == 1
    assert p[1, 0 * grid + 2, 0 * grid + 2] == 1  # top row: off the grid, attends to itself
    # Head 5 uses offset 0: (-1, -1), up and left.
    assert p[5, 2 * grid + 2, 1 * grid + 1] == 1 and p[5, 1 * grid + 0, 1 * grid + 0] == 1


def test_pattern_error_worked_example():
    target = np.array([[[1.0, 1.0], [0.0, 1.0]]])
    attention = np.array([[[1.0, 0.0], [0.0, 1.0]]])
    # Row 0: TV(1,0 ; .5,.5) = 0.5; row 1: 0.
    assert qp.pattern_error(attention, target) == 0.25
    assert qp.pattern_error(target / target.sum(-1, keepdims=True), target) == 0.0
