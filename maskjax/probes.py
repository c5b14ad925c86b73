"""What the studies measure about a prior while it trains, as pure functions of arrays.

A drift is only as good as the inputs it is measured on: they must exercise every token the prior
talks about (for the Boolean tasks, points where every bit takes both values, seen and unseen alike;
`maskjax.tasks.boolean.probe_points`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

CHANGE_KEYS = ("mask_change_open_mean", "mask_change_open_max", "mask_change_closed_mean", "mask_change_closed_max")


def row_total_variation(a: jax.Array, b: jax.Array) -> jax.Array:
    """Total-variation distance between attention rows (distributions over the last axis): a.shape[:-1]."""
    return 0.5 * jnp.abs(a - b).sum(-1)


def region_means(values_P: jax.Array, seen_P: jax.Array, seen_share: float) -> dict[str, jax.Array]:
    """Means over the probe points of each region, and the cube's mean: the two weighted by the share of
    the cube each region holds (the probe set holds them in equal numbers, not in the cube's ratio).
    values_P: [points, ...]."""
    weights = seen_P.astype(values_P.dtype).reshape(-1, *([1] * (values_P.ndim - 1)))
    seen = (values_P * weights).sum(0) / weights.sum()
    unseen = (values_P * (1 - weights)).sum(0) / (1 - weights).sum()
    return {"all": seen_share * seen + (1 - seen_share) * unseen, "seen": seen, "unseen": unseen}


def region_weighted(values_P: np.ndarray, seen_P: np.ndarray, seen_share: float) -> np.ndarray:
    """`region_means(...)["all"]` in float64 numpy, for what is measured once on the host."""
    weights = np.where(seen_P, seen_share / seen_P.sum(), (1 - seen_share) / (~seen_P).sum())
    return np.tensordot(weights, np.asarray(values_P, np.float64), axes=1)


def mask_logit_change(initial: jax.Array, current: jax.Array) -> dict[str, jax.Array]:
    """|M_t - M_0| over the open (M_0 >= 0) and the closed (M_0 < 0) entries apart: mean and max, per
    leading index (layer). 0 where a layer has no entry of a kind (an all-zero mask has no closed one)."""
    change = jnp.abs(current - initial).reshape(initial.shape[0], -1)
    closed = (initial < 0).reshape(initial.shape[0], -1)
    out = {}
    for kind, where in (("open", ~closed), ("closed", closed)):
        kept = jnp.where(where, change, 0)
        out[f"mask_change_{kind}_mean"] = kept.sum(-1) / jnp.maximum(where.sum(-1), 1)
        out[f"mask_change_{kind}_max"] = kept.max(-1)
    return out


def mask_persistence(initial: jax.Array, current: jax.Array) -> dict[str, jax.Array]:
    """Per leading index (layer): the mean |M_t - M_0| (`mask_change_mean`) and the fraction of entries
    still on their side of 0 (`mask_sign_kept`; an entry at 0 counts as the open side)."""
    flat_0, flat_t = initial.reshape(initial.shape[0], -1), current.reshape(current.shape[0], -1)
    return {
        "mask_change_mean": jnp.abs(flat_t - flat_0).mean(-1),
        "mask_sign_kept": ((flat_t >= 0) == (flat_0 >= 0)).mean(-1),
    }
