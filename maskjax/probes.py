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


def outside_mass(attention_LBHQK: jax.Array, open_QK: jax.Array) -> jax.Array:
    """The attention weight on keys a 0/1 pattern closes, averaged over inputs, heads and queries: [layers].
    Against one window for every method (vision: the locality pattern), it says how far each method's
    attention reaches beyond the neighbourhood the mask opens, for methods with no mask as well."""
    return (attention_LBHQK * (1 - open_QK)).sum(-1).mean(axis=(1, 2, 3))


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


# Layer 0's value at the last probe of a record's per-chunk, per-layer curves, by the names the tables use.
END_OF_RUN = {
    "drift_end": "attention_drift",
    "drift_end_seen": "attention_drift_seen",
    "drift_end_unseen": "attention_drift_unseen",
    "logit_drift_end": "prior_logit_drift",
    "mask_open_change_end": "mask_change_open_mean",
    "mask_closed_change_end": "mask_change_closed_mean",
}


def end_of_run(record: dict) -> dict[str, float]:
    """What a finished run's record says about the end of training: `END_OF_RUN`, and where the record has
    gradient probes, the gradient norms reaching the mask and W_Q/W_K at the first and last probe (mean over
    layers) and their ratio at the end; with an open mask logit, the factor sigmoid(-open) of Theorem 1."""
    found = {name: record[curve][-1][0] for name, curve in END_OF_RUN.items() if record.get(curve)}
    if record.get("open_value") is not None:
        found["sigmoid_minus_open"] = 1 / (1 + np.exp(record["open_value"]))
    if record.get("grad_norm_qk"):
        mask = np.asarray(record["grad_norm_mask"], np.float64).mean(-1)
        qk = np.asarray(record["grad_norm_qk"], np.float64).mean(-1)
        found |= {"mask_first": mask[0], "mask_last": mask[-1], "qk_first": qk[0], "qk_last": qk[-1]}
        found["mask_over_qk_last"] = mask[-1] / qk[-1] if mask[-1] > 0 else None
    return {k: None if v is None else float(v) for k, v in found.items()}
