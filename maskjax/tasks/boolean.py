"""Boolean "generalisation on the unseen" (GOTU) tasks on the cube {-1,+1}^n.

A task is a target function, a seen region (the training set is every seen point of the
cube) and the groups of interacting bits its mask prior is built from. The minimum-degree
interpolator (MDI) is what the paper's vanilla Transformer converges to; it is computed
here by a general solver, not a per-task formula.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from collections.abc import Callable

import numpy as np

from maskjax import mask_patterns
from maskjax.errors import ConfigError


@dataclasses.dataclass(frozen=True, eq=False)
class BooleanTask:
    """target and seen take a [..., n_bits] array of +-1 values; groups are the interacting bits."""

    name: str
    n_bits: int
    target: Callable[[np.ndarray], np.ndarray]
    seen: Callable[[np.ndarray], np.ndarray]
    groups: tuple[tuple[int, ...], ...]


MASK_KINDS = ("oracle", "misspecified", "random")


def mask_pattern(task: BooleanTask, kind: str, row_policy: str = "diagonal", seed: int = 0) -> np.ndarray:
    """The task's mask pattern of a kind, over [CLS, bits]: "oracle" (its interacting groups),
    "misspecified" (the groups moved onto bits that do not interact) or "random" (as many open entries at
    random, drawn from seed). The pattern read off the training data is `maskjax.discover.task_pattern`."""
    oracle = mask_patterns.group_pattern(task.n_bits, task.groups, row_policy)
    if kind == "oracle":
        return oracle
    if kind == "misspecified":
        groups = mask_patterns.misspecified_groups(task.n_bits, task.groups)
        return mask_patterns.group_pattern(task.n_bits, groups, row_policy)
    if kind == "random":
        return mask_patterns.random_pattern(oracle, seed)
    raise ConfigError(f"no {kind!r} mask pattern for a Boolean task; known: {', '.join(MASK_KINDS)}, learned")


def cube(n_bits: int) -> np.ndarray:
    """Every point of {-1,+1}^n as [2**n, n] int8; row i has bit j = -1 iff bit j of i is set."""
    index = np.arange(2**n_bits)[:, None]
    return (1 - 2 * ((index >> np.arange(n_bits)) & 1)).astype(np.int8)


def probe_points(task: BooleanTask, count: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A fixed sample of the cube to measure attention on: count // 2 unseen points and the rest seen,
    each drawn without replacement with numpy's generator at `seed`, so every run, method and seed is
    measured on the same points and every bit takes both values. Returns (x [count, n_bits] float32,
    seen [count] bool). A strided slice of `cube` would not do: its rows share their low bits."""
    points = cube(task.n_bits)
    seen = np.asarray(task.seen(points), bool)
    rng = np.random.default_rng(seed)
    unseen_count = count // 2
    rows = []
    for region, wanted in ((seen, count - unseen_count), (~seen, unseen_count)):
        members = np.flatnonzero(region)
        if wanted > len(members):
            raise ConfigError(f"{task.name}: {wanted} probe points asked of a region of {len(members)}")
        rows.append(rng.choice(members, size=wanted, replace=False))
    index = np.concatenate(rows)
    return points[index].astype(np.float32), seen[index]


def seen_share(task: BooleanTask) -> float:
    """The fraction of the cube in the seen region."""
    return float(np.mean(task.seen(cube(task.n_bits))))


def walsh_hadamard(values: np.ndarray) -> np.ndarray:
    """Fourier coefficients over the last axis (length 2**n, indexed as in `cube`).

    Coefficient S (a bit set, as an integer) is mean_x f(x) prod_{j in S} x_j.
    """
    out = np.array(values, dtype=np.float64)
    n = int(np.log2(out.shape[-1]))
    lead = out.shape[:-1]
    for j in range(n):
        out = out.reshape(*lead, -1, 2, 2**j)
        a, b = out[..., 0, :], out[..., 1, :]
        out = np.stack([a + b, a - b], axis=-2)
    return out.reshape(*lead, 2**n) / 2**n


def degree_profile(values: np.ndarray) -> np.ndarray:
    """Fourier mass sum_{|S|=d} f_hat(S)^2 for d = 0..n of a function given on the whole cube."""
    coeffs = walsh_hadamard(values)
    n = int(np.log2(coeffs.shape[-1]))
    degrees = np.array([bin(s).count("1") for s in range(2**n)])
    return np.array([np.sum(coeffs[..., degrees == d] ** 2, axis=-1) for d in range(n + 1)])


def parity_pair(task: BooleanTask) -> tuple[int, int] | None:
    """The two bits whose product the target is, when it is the parity of two bits (2Parity), else None."""
    points = cube(task.n_bits).astype(np.float64)
    target = np.asarray(task.target(points), np.float64)
    return next(
        (
            (i, j)
            for i, j in itertools.combinations(range(task.n_bits), 2)
            if np.array_equal(target, points[:, i] * points[:, j])
        ),
        None,
    )


def pair_coefficient(values: np.ndarray, pair: tuple[int, int]) -> float:
    """The Fourier coefficient t of x_i x_j in a function given on the whole cube. Averaged over the other
    bits, any function that fits the three seen corners of x_i x_j (unseen where both are -1) is
    (t - 1) + (1 - t)(x_i + x_j) + t x_i x_j, so it predicts 4t - 3 on the unseen corner: the sign there is
    right (+1) only when t > 0.75, and the MDI has t = 0."""
    points = cube(int(np.log2(np.shape(values)[-1]))).astype(np.float64)
    return float(np.mean(np.asarray(values, np.float64) * points[:, pair[0]] * points[:, pair[1]], axis=-1))


def _popcount(n_bits: int) -> np.ndarray:
    return np.array([bin(s).count("1") for s in range(2**n_bits)])


def _lexicographic_min_degree(seen_K: np.ndarray, data_MS: np.ndarray) -> np.ndarray:
    """Interpolate each row of data on the seen points of a k-bit cube, least mass at the top degree first.

    The free unknowns are the values on the unseen points. Each degree, from k down to 0,
    is minimised by least squares inside the solution set left by the degrees above it.
    Returns values on the whole k-bit cube, [m, 2**k].
    """
    size = seen_K.size
    k = int(np.log2(size))
    hadamard = np.array([[(-1) ** bin(s & x).count("1") for x in range(size)] for s in range(size)], float)
    hadamard /= size
    fixed = np.zeros((size, data_MS.shape[0]))
    fixed[seen_K] = data_MS.T
    coeff_base = hadamard @ fixed
    coeff_free = hadamard[:, ~seen_K]
    z = np.zeros((coeff_free.shape[1], data_MS.shape[0]))
    basis = np.eye(coeff_free.shape[1])
    degrees = _popcount(k)
    for d in range(k, -1, -1):
        if basis.shape[1] == 0:
            break
        rows = degrees == d
        a = coeff_base[rows] + coeff_free[rows] @ z
        b = coeff_free[rows] @ basis
        w, *_ = np.linalg.lstsq(b, -a, rcond=None)
        z = z + basis @ w
        _, s, vt = np.linalg.svd(b)
        rank = int(np.sum(s > 1e-10 * max(1.0, s.max(initial=0.0))))
        basis = basis @ vt[rank:].T
    full = fixed.copy()
    full[~seen_K] = z
    return full.T


@functools.cache
def minimum_degree_interpolator(task: BooleanTask) -> tuple[np.ndarray, np.ndarray]:
    """(cube, values): the whole cube [2**n, n] and the MDI of the seen data at each point.

    The seen region usually depends on a few bits K only. Writing f(x) = sum_T chi_T(x_rest) f_T(x_K),
    the problem splits into independent k-bit problems, one per T, whose lexicographic order is the
    same for every T; so one k-bit solve handles all of them at once.
    """
    points = cube(task.n_bits)
    n = task.n_bits
    seen = np.asarray(task.seen(points), bool)
    index = np.arange(2**n)
    depends = [j for j in range(n) if np.any(seen != seen[index ^ (1 << j)])]
    if len(depends) > 12:
        raise ConfigError(
            f"task {task.name!r}: the seen region depends on {len(depends)} bits; the solver handles at most 12"
        )
    rest = [j for j in range(n) if j not in depends]
    order = rest + depends
    # Reindex so the K bits are the high bits: value[t_rest + 2**len(rest) * x_K].
    perm_index = sum(((index >> i) & 1) << order[i] for i in range(n))
    values = np.asarray(task.target(points), np.float64)[perm_index]
    seen_perm = seen[perm_index]
    grid = values.reshape(2 ** len(depends), 2 ** len(rest))
    seen_K = seen_perm.reshape(2 ** len(depends), 2 ** len(rest))[:, 0]
    coeff_rest = walsh_hadamard(grid)
    solved = _lexicographic_min_degree(seen_K, coeff_rest[seen_K].T)
    # Back from Fourier over the rest bits to values: f(x) = sum_T f_T chi_T(x).
    full_grid = walsh_hadamard(solved.T) * 2 ** len(rest)
    mdi = np.empty(2**n)
    mdi[perm_index] = full_grid.reshape(-1)
    return points, mdi


def target_levels(task: BooleanTask) -> np.ndarray:
    """The distinct values the target takes on the cube, for rounding predictions."""
    return np.unique(np.round(np.asarray(task.target(cube(task.n_bits)), np.float64), 9))


def round_to_levels(pred: np.ndarray, levels: np.ndarray) -> np.ndarray:
    """Each prediction replaced by the nearest value the target takes."""
    pred, levels = np.asarray(pred, np.float64), np.asarray(levels, np.float64)
    return levels[np.argmin(np.abs(pred[..., None] - levels), axis=-1)]


def scores(task: BooleanTask, pred: np.ndarray) -> dict[str, float]:
    """acc_all (whole cube), acc_unseen and mse of predictions on `cube(task.n_bits)`."""
    points = cube(task.n_bits)
    truth = np.asarray(task.target(points), np.float64)
    unseen = ~np.asarray(task.seen(points), bool)
    correct = np.isclose(round_to_levels(pred, target_levels(task)), truth)
    return {
        "acc_all": float(correct.mean()),
        "acc_unseen": float(correct[unseen].mean()),
        "mse": float(np.mean((np.asarray(pred, np.float64) - truth) ** 2)),
    }


def two_parity(n_bits: int, name: str = "2parity") -> BooleanTask:
    """x0 x1 on n bits, unseen where x0 = x1 = -1; the paper's 2Parity is n_bits = 15."""
    return BooleanTask(
        name,
        n_bits,
        target=lambda x: x[..., 0] * x[..., 1],
        seen=lambda x: (x[..., 0] == 1) | (x[..., 1] == 1),
        groups=((0, 1),),
    )


def _cyclic3(x: np.ndarray) -> np.ndarray:
    return sum(x[..., i] * x[..., (i + 1) % 15] * x[..., (i + 2) % 15] for i in range(15))


TASKS: dict[str, BooleanTask] = {
    t.name: t
    for t in [
        two_parity(15),
        BooleanTask(
            "cyclic3",
            15,
            target=_cyclic3,
            seen=lambda x: (x[..., 0] == 1) | (x[..., 1] == 1) | (x[..., 2] == 1),
            groups=tuple((i, (i + 1) % 15, (i + 2) % 15) for i in range(15)),
        ),
        BooleanTask(
            "majority3",
            15,
            target=lambda x: np.sign(x[..., 0] + x[..., 1] + x[..., 2]),
            seen=lambda x: (x[..., 0] == 1) | (x[..., 1] == 1),
            groups=((0, 1, 2),),
        ),
        BooleanTask(
            "threesym",
            15,
            target=lambda x: x[..., 0] * x[..., 1] - 1.25 * x[..., 1] * x[..., 2] + 1.5 * x[..., 2] * x[..., 0],
            seen=lambda x: x[..., 0] * x[..., 1] * x[..., 2] == 1,
            groups=((0, 1, 2),),
        ),
        # Not in the paper: held out from the design of `maskjax.discover`, to test it on new structure.
        BooleanTask(
            "majority5",
            15,
            target=lambda x: np.sign(x[..., :5].sum(-1)),
            seen=lambda x: (x[..., 0] == 1) | (x[..., 1] == 1),
            groups=((0, 1, 2, 3, 4),),
        ),
        BooleanTask(
            "pairsum",
            15,
            target=lambda x: x[..., 0] * x[..., 1] + x[..., 5] * x[..., 6],
            seen=lambda x: (x[..., 0] == 1) | (x[..., 1] == 1),
            groups=((0, 1), (5, 6)),
        ),
    ]
}

PAPER_TASKS = ("2parity", "cyclic3", "majority3", "threesym")


def get_task(name: str) -> BooleanTask:
    if name not in TASKS:
        raise ConfigError(f"unknown task {name!r}; known: {', '.join(TASKS)}")
    return TASKS[name]
