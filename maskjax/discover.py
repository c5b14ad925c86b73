"""A mask prior found from the training data alone: which bits interact, read off finite differences.

A mask says which bits interact. On the cube, bits j and k interact at x when the second difference
f(x) - f(x^j) - f(x^k) + f(x^jk) is non-zero (x^j: x with bit j flipped); bit j matters at x when
f(x) != f(x^j). A training set decides such a statement only where it holds all the points involved.
Each bit and each pair therefore gets one of three verdicts: SHOWN (a non-zero difference was seen),
RULED_OUT (testable, and zero wherever tested) or UNTESTED (the data never holds a full square).

The learned pattern keeps every bit that is not ruled out and opens every pair among them that is not
ruled out: it closes only what the data contradicts. GOTU hides exactly the corner that would show
2Parity's x0 x1 interaction, so that pair is UNTESTED and stays open; a rule that opened only SHOWN
pairs would close it. No target value outside the training set is ever read.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import numpy as np

from maskjax import mask_patterns
from maskjax.errors import ConfigError
from maskjax.tasks.boolean import BooleanTask, cube

SHOWN, UNTESTED, RULED_OUT = 1, 0, -1


class Evidence(NamedTuple):
    """Verdicts per bit [n] and per pair of bits [n, n] (symmetric; the diagonal is RULED_OUT)."""

    bits: np.ndarray
    pairs: np.ndarray


def cube_index(points: np.ndarray) -> np.ndarray:
    """The row of `cube(n)` that each +-1 point is (bit j = -1 sets bit j of the index)."""
    points = np.asarray(points)
    return ((points < 0).astype(np.int64) << np.arange(points.shape[-1])).sum(-1)


def _verdict(observed: np.ndarray, differs: np.ndarray) -> int:
    if np.any(observed & differs):
        return SHOWN
    return RULED_OUT if np.any(observed) else UNTESTED


def interaction_evidence(points: np.ndarray, values: np.ndarray, atol: float = 1e-6) -> Evidence:
    """The verdicts from a training set of +-1 points [P, n] and their targets [P].

    Differences within atol count as zero; a point listed twice must carry the same value.
    """
    points = np.asarray(points)
    if points.ndim != 2 or points.shape[0] != np.shape(values)[0]:
        raise ConfigError(f"need points [P, n] and values [P], got {points.shape} and {np.shape(values)}")
    if not np.all(np.isin(points, (-1, 1))):
        raise ConfigError("points must be +-1")
    n_bits = points.shape[1]
    index = cube_index(points)
    observed = np.zeros(2**n_bits, bool)
    table = np.zeros(2**n_bits)
    observed[index] = True
    table[index] = values
    if not np.allclose(table[index], values, atol=atol):
        raise ConfigError("a point appears twice with different values")
    everything = np.arange(2**n_bits)
    flip = [everything ^ (1 << j) for j in range(n_bits)]
    bits = np.array(
        [_verdict(observed & observed[flip[j]], np.abs(table - table[flip[j]]) > atol) for j in range(n_bits)],
        np.int8,
    )
    pairs = np.full((n_bits, n_bits), RULED_OUT, np.int8)
    for j in range(n_bits):
        for k in range(j + 1, n_bits):
            both = flip[j] ^ (1 << k)
            square = observed & observed[flip[j]] & observed[flip[k]] & observed[both]
            second = table - table[flip[j]] - table[flip[k]] + table[both]
            pairs[j, k] = pairs[k, j] = _verdict(square, np.abs(second) > atol)
    return Evidence(bits, pairs)


def learned_groups(evidence: Evidence) -> tuple[tuple[int, ...], ...]:
    """Open pairs among the bits not ruled out, plus each such bit that has no open pair, alone."""
    keep = evidence.bits != RULED_OUT
    n_bits = keep.size
    pairs = tuple(
        (j, k)
        for j in range(n_bits)
        for k in range(j + 1, n_bits)
        if keep[j] and keep[k] and evidence.pairs[j, k] != RULED_OUT
    )
    paired = {b for pair in pairs for b in pair}
    return pairs + tuple((j,) for j in range(n_bits) if keep[j] and j not in paired)


def learned_pattern(points: np.ndarray, values: np.ndarray, row_policy: str = "diagonal") -> np.ndarray:
    """The (n+1) x (n+1) open pattern over [CLS, bits] that the training set supports."""
    evidence = interaction_evidence(points, values)
    return mask_patterns.group_pattern(evidence.bits.size, learned_groups(evidence), row_policy)


@functools.cache
def _task_groups(task: BooleanTask) -> tuple[tuple[int, ...], ...]:
    points = cube(task.n_bits)
    seen = np.asarray(task.seen(points), bool)
    return learned_groups(interaction_evidence(points[seen], np.asarray(task.target(points[seen]), np.float64)))


def task_pattern(task: BooleanTask, row_policy: str = "diagonal") -> np.ndarray:
    """The learned pattern of a GOTU task, from its training set: every seen point of the cube."""
    return mask_patterns.group_pattern(task.n_bits, _task_groups(task), row_policy)


def recovery(learned: np.ndarray, oracle: np.ndarray) -> dict[str, int | bool]:
    """How a learned pattern differs from the oracle's among the bits (the CLS row aside)."""
    off_diagonal = ~np.eye(np.shape(oracle)[0] - 1, dtype=bool)
    learned_bits = np.asarray(learned, bool)[1:, 1:] & off_diagonal
    oracle_bits = np.asarray(oracle, bool)[1:, 1:] & off_diagonal
    return {
        "recovered": bool(np.array_equal(learned, oracle)),
        "missing_pairs": int(np.sum(oracle_bits & ~learned_bits)) // 2,
        "extra_pairs": int(np.sum(learned_bits & ~oracle_bits)) // 2,
    }
