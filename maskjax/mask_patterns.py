"""Mask priors as (n_bits+1) x (n_bits+1) patterns over the tokens [CLS, x_0, ..., x_{n-1}].

A pattern is a boolean "open" matrix; `mask_logits` turns it into the logits M with the
open and closed values. Rows are queries, columns keys. log_sigmoid(M) can only close entries
and an all-closed row is uniform again after softmax, so every policy keeps one open entry per row.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from maskjax.errors import ConfigError

ROW_POLICIES = {
    "diagonal": "members see their groups; CLS sees itself and every member; other bits see only themselves",
    "members": "members see their groups; CLS and the other bits see every member (and nothing else)",
    "cls_all": "as 'diagonal', but the CLS row is fully open",
}


def group_pattern(n_bits: int, groups: Sequence[Sequence[int]], row_policy: str = "diagonal") -> np.ndarray:
    """Open within each group of interacting bits; the remaining rows follow `row_policy`."""
    if row_policy not in ROW_POLICIES:
        raise ConfigError(f"unknown row policy {row_policy!r}; known: {', '.join(ROW_POLICIES)}")
    size = n_bits + 1
    for group in groups:
        if any(not 0 <= b < n_bits for b in group):
            raise ConfigError(f"group {tuple(group)} names a bit outside 0..{n_bits - 1}")
    members = sorted({b + 1 for group in groups for b in group})
    open_ = np.zeros((size, size), bool)
    for group in groups:
        tokens = [b + 1 for b in group]
        open_[np.ix_(tokens, tokens)] = True
    outsiders = [t for t in range(size) if t not in members]
    if row_policy == "members":
        open_[np.ix_(outsiders, members)] = True
    else:
        open_[outsiders, outsiders] = True
        open_[0, members] = True
        if row_policy == "cls_all":
            open_[0, :] = True
    return open_


def mask_logits(pattern: np.ndarray | jax.Array, open_value: float | jax.Array, closed_value: float | jax.Array):
    """M = open_value where the pattern is open, closed_value elsewhere (values may be traced per run)."""
    return jnp.where(jnp.asarray(pattern, bool), jnp.asarray(open_value, jnp.float32), closed_value).astype(jnp.float32)


def interacting_pairs(groups: Sequence[Sequence[int]]) -> set[frozenset[int]]:
    return {frozenset((a, b)) for group in groups for a in group for b in group if a != b}


def misspecified_groups(n_bits: int, groups: Sequence[Sequence[int]]) -> tuple[tuple[int, ...], ...]:
    """The groups moved onto bits that do not interact: every bit shifted by the smallest s >= 1
    (mod n_bits) for which no shifted pair is an oracle pair. 2Parity's x0<->x1 becomes x1<->x2.

    Same sizes, so the same number of open entries under any row policy.
    """
    oracle = interacting_pairs(groups)
    for shift in range(1, n_bits):
        moved = tuple(tuple((b + shift) % n_bits for b in group) for group in groups)
        if not interacting_pairs(moved) & oracle:
            return moved
    raise ConfigError("no shift of these groups avoids every interacting pair (e.g. cyclic3); no misspecified mask")


def random_pattern(reference: np.ndarray, seed: int) -> np.ndarray:
    """A random pattern with as many open entries as `reference`: the diagonal (so every row keeps an
    open entry) plus the rest placed uniformly off the diagonal."""
    size = reference.shape[0]
    extra = int(reference.sum()) - size
    if extra < 0:
        raise ConfigError("the reference pattern has fewer open entries than tokens")
    off_diagonal = np.flatnonzero(~np.eye(size, dtype=bool))
    chosen = np.random.default_rng(seed).choice(off_diagonal, size=extra, replace=False)
    pattern = np.eye(size, dtype=bool)
    pattern.flat[chosen] = True
    return pattern


CLS_POLICIES = {
    "open": "the CLS token sees every patch and itself, and every patch sees the CLS token",
    "self": "the CLS token sees only itself, and no patch sees it",
}


def locality_pattern(grid: int, radius: int = 1, cls_policy: str | None = None) -> np.ndarray:
    """The 2D locality prior on a grid x grid patch layout (patches in row-major order): (i, j) open when
    patches i and j lie within Chebyshev distance `radius` (radius 1: the 3 x 3 neighbourhood, self
    included). With cls_policy, a CLS token at position 0 follows `CLS_POLICIES[cls_policy]`."""
    if grid < 1:
        raise ConfigError(f"grid must be >= 1, got {grid}")
    if radius < 0:
        raise ConfigError(f"locality radius must be >= 0, got {radius}")
    rows, cols = np.divmod(np.arange(grid * grid), grid)
    distance = np.maximum(np.abs(rows[:, None] - rows[None, :]), np.abs(cols[:, None] - cols[None, :]))
    patches = distance <= radius
    if cls_policy is None:
        return patches
    if cls_policy not in CLS_POLICIES:
        raise ConfigError(f"unknown CLS policy {cls_policy!r}; known: {', '.join(CLS_POLICIES)}")
    open_ = np.zeros((grid * grid + 1,) * 2, bool)
    open_[1:, 1:] = patches
    open_[0, 0] = True
    if cls_policy == "open":
        open_[0, :] = open_[:, 0] = True
    return open_


def random_rows(reference: np.ndarray, seed: int) -> np.ndarray:
    """A random pattern with as many open entries in every row as `reference`: each row keeps its
    diagonal and places the rest uniformly among its other entries."""
    size = reference.shape[0]
    rng = np.random.default_rng(seed)
    pattern = np.eye(size, dtype=bool)
    for row in range(size):
        extra = int(reference[row].sum()) - 1
        if extra < 0:
            raise ConfigError(f"row {row} of the reference pattern has no open entry")
        others = np.delete(np.arange(size), row)
        pattern[row, rng.choice(others, size=extra, replace=False)] = True
    return pattern


IMPULSE_OFFSET_ORDER = (4, 1, 5, 3, 7, 0, 2, 6, 8)


def impulse_patterns(grid: int, heads: int) -> np.ndarray:
    """Shifted identities on a grid x grid patch layout (Zheng et al.): [heads, grid**2, grid**2] boolean.

    Head i attends from patch (r, c) to (r + dr, c + dc), the offset being IMPULSE_OFFSET_ORDER[i mod 9]
    on the 3 x 3 kernel (4 = centre, the identity). As in the published code the grid is zero-padded:
    a patch whose target falls off the grid has no open entry (its row of the QK target is noise only).
    """
    n = grid * grid
    out = np.zeros((heads, n, n), bool)
    for h in range(heads):
        offset = IMPULSE_OFFSET_ORDER[h % 9]
        dr, dc = offset // 3 - 1, offset % 3 - 1
        for r in range(grid):
            for c in range(grid):
                rr, cc = r + dr, c + dc
                if 0 <= rr < grid and 0 <= cc < grid:
                    out[h, r * grid + c, rr * grid + cc] = True
    return out


def row_distribution(mask_logits_NN: np.ndarray) -> np.ndarray:
    """softmax(log_sigmoid(M)) per row: the attention a mask prior asks for when Q.K contributes nothing."""
    bias = -np.logaddexp(0.0, -np.asarray(mask_logits_NN, np.float64))
    p = np.exp(bias - bias.max(-1, keepdims=True))
    return p / p.sum(-1, keepdims=True)
