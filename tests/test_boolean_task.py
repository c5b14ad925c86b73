import numpy as np
import pytest

from maskjax.tasks import boolean as tb


@pytest.mark.parametrize(
    "name, acc_all", [("2parity", 0.75), ("cyclic3", 0.875), ("majority3", 0.875), ("threesym", 0.625)]
)
def test_mdi_scores(name, acc_all):
    task = tb.get_task(name)
    points, values = tb.minimum_degree_interpolator(task)
    assert points.shape == (2**15, 15)
    seen = task.seen(points)
    np.testing.assert_allclose(values[seen], task.target(points)[seen], atol=1e-9)
    assert tb.scores(task, values)["acc_all"] == pytest.approx(acc_all)


def test_mdi_matches_the_closed_forms_of_the_paper():
    x = tb.cube(15).astype(float)
    closed = {
        "2parity": x[:, 0] + x[:, 1] - 1,
        "cyclic3": tb._cyclic3(x) + (1 - x[:, 0]) * (1 - x[:, 1]) * (1 - x[:, 2]),
        "majority3": (x[:, 0] + x[:, 1] + 2 * x[:, 2] - x[:, 0] * x[:, 2] - x[:, 1] * x[:, 2]) / 2,
        "threesym": x[:, 2] - 1.25 * x[:, 0] + 1.5 * x[:, 1],
    }
    for name, expected in closed.items():
        np.testing.assert_allclose(tb.minimum_degree_interpolator(tb.get_task(name))[1], expected, atol=1e-9)


def brute_force_mdi(task):
    """Dense lexicographic solve over every Fourier coefficient, for small n only."""
    n = task.n_bits
    points = tb.cube(n)
    seen = task.seen(points)
    chars = np.array([[np.prod(p[[j for j in range(n) if s >> j & 1]]) for s in range(2**n)] for p in points], float)
    degrees = np.array([bin(s).count("1") for s in range(2**n)])
    y = task.target(points).astype(float)
    # Values on the unseen points are the unknowns; coefficients are chars.T @ f / 2**n.
    free = np.eye(2**n)[:, ~seen]
    base = np.where(seen, y, 0.0)
    z = np.zeros(free.shape[1])
    basis = np.eye(free.shape[1])
    for d in range(n, -1, -1):
        rows = chars.T[degrees == d] / 2**n
        a, b = rows @ (base + free @ z), rows @ free @ basis
        w = np.linalg.lstsq(b, -a, rcond=None)[0]
        z = z + basis @ w
        _, s, vt = np.linalg.svd(b)
        basis = basis @ vt[int(np.sum(s > 1e-10)) :].T
    return base + free @ z


def test_general_solver_on_a_user_task_against_brute_force():
    task = tb.BooleanTask(
        "mine",
        6,
        target=lambda x: x[..., 0] * x[..., 3] * x[..., 4] + x[..., 1],
        seen=lambda x: (x[..., 0] == 1) | (x[..., 3] * x[..., 5] == 1),
        groups=((0, 3, 4), (1,)),
    )
    np.testing.assert_allclose(tb.minimum_degree_interpolator(task)[1], brute_force_mdi(task), atol=1e-8)


def test_degree_profile_and_walsh_hadamard():
    x = tb.cube(4).astype(float)
    profile = tb.degree_profile(2 * x[:, 0] * x[:, 2] + 0.5)
    np.testing.assert_allclose(profile, [0.25, 0, 4, 0, 0])
    coeffs = tb.walsh_hadamard(x[:, 1] * x[:, 3])
    assert coeffs[0b1010] == pytest.approx(1.0)
    assert np.sum(np.abs(coeffs)) == pytest.approx(1.0)


def test_rounding_metric():
    task = tb.get_task("2parity")
    assert list(tb.target_levels(task)) == [-1.0, 1.0]
    np.testing.assert_array_equal(tb.round_to_levels(np.array([-3.0, -0.1, 0.2, 7.0]), [-1.0, 1.0]), [-1, -1, 1, 1])


def test_unknown_task():
    with pytest.raises(ValueError, match="unknown task 'nope'"):
        tb.get_task("nope")


def test_the_pair_coefficient_decides_the_unseen_corner():
    """Any function of x0, x1 fitting 2Parity's three seen corners is (t-1) + (1-t)(x0+x1) + t x0x1 and
    predicts 4t - 3 on the unseen corner; other bits add nothing to t."""
    from maskjax.tasks.boolean import cube, get_task, pair_coefficient, parity_pair

    task = get_task("2parity")
    assert parity_pair(task) == (0, 1) and parity_pair(get_task("majority3")) is None
    x = cube(task.n_bits).astype(np.float64)
    rng = np.random.default_rng(0)
    for t in (0.0, 0.3, 0.75, 0.9):
        f = (t - 1) + (1 - t) * (x[:, 0] + x[:, 1]) + t * x[:, 0] * x[:, 1] + 0.1 * x[:, 2] * x[:, 3]
        f += rng.normal(0, 1e-3) * x[:, 4]
        assert np.isclose(pair_coefficient(f, (0, 1)), t)
        unseen = (x[:, 0] == -1) & (x[:, 1] == -1)
        assert np.allclose(f[unseen] - 0.1 * x[unseen, 2] * x[unseen, 3], 4 * t - 3, atol=1e-2)
