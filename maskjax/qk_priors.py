"""The same attention patterns injected through W_Q, W_K instead of an additive mask.

Conventions: per head h, logits = X Q_h K_h^T X^T / sqrt(head_dim); X for the prior is a
content-free pseudo-input, LayerNorm (no affine) of the positional embeddings. Q and K come out as
[d, heads, head_dim], the layout of a Flax `query.kernel` / `key.kernel`. Every initialiser is a
pure function of its key. Ported from the published algorithms (structured initialisation,
Zheng et al. 2024/2025; mimetic initialisation, Trockman & Kolter 2023), not their code.
"""

from __future__ import annotations

import numpy as np

IMPULSE_OFFSET_ORDER = (4, 1, 5, 3, 7, 0, 2, 6, 8)


def layer_norm(x: np.ndarray, eps: float = 1e-5) -> np.ndarray:
    """LayerNorm over the last axis, no affine parameters."""
    x = np.asarray(x, np.float64)
    mean = x.mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(x.var(-1, keepdims=True) + eps)


def truncated_pinv(x: np.ndarray, rank: int) -> np.ndarray:
    """Pseudo-inverse of x keeping its top `rank` singular values: [d, N] for x of [N, d]."""
    u, s, vt = np.linalg.svd(np.asarray(x, np.float64), full_matrices=False)
    rank = min(rank, int(np.sum(s > 1e-10 * s.max())))
    return vt[:rank].T @ np.diag(1.0 / s[:rank]) @ u[:, :rank].T


def truncated_normal(rng: np.random.Generator, std: float, shape: tuple[int, ...]) -> np.ndarray:
    """Normal(0, std) truncated at +-2 std, by resampling."""
    out = rng.normal(0.0, std, shape)
    bad = np.abs(out) > 2 * std
    while bad.any():
        out[bad] = rng.normal(0.0, std, int(bad.sum()))
        bad = np.abs(out) > 2 * std
    return out


def svd_qk(
    pattern_HNN: np.ndarray,
    positions_ND: np.ndarray,
    head_dim: int,
    seed: int,
    *,
    big: float = 1000.0,
    noise: float = 3.0,
    noise_std: float = 0.6,
    qk_scale: float = 7.0,
) -> tuple[np.ndarray, np.ndarray]:
    """Closed-form QK prior: Q_h K_h^T ~ pe+ W_h pe+^T with W_h = big * H_h + noise on the closed entries.

    pattern_HNN: 0/1 target per head; positions_ND: the positional embeddings. Q_h and K_h are the
    top-head_dim SVD factors (U sqrt S, V sqrt S), each scaled to Frobenius norm qk_scale.
    """
    pattern_HNN = np.asarray(pattern_HNN, np.float64)
    rng = np.random.default_rng(seed)
    pe_pinv = truncated_pinv(layer_norm(positions_ND), head_dim)
    heads, d = pattern_HNN.shape[0], positions_ND.shape[1]
    q = np.zeros((d, heads, head_dim))
    k = np.zeros((d, heads, head_dim))
    for h in range(heads):
        target = big * pattern_HNN[h] + noise * truncated_normal(rng, noise_std, pattern_HNN[h].shape) * (
            1 - pattern_HNN[h]
        )
        u, s, vt = np.linalg.svd(pe_pinv @ target @ pe_pinv.T)
        root = np.sqrt(s[:head_dim])
        qh, kh = u[:, :head_dim] * root, vt[:head_dim].T * root
        q[:, h] = qk_scale * qh / np.linalg.norm(qh)
        k[:, h] = qk_scale * kh / np.linalg.norm(kh)
    return q, k


def mimetic_factors(
    d: int, heads: int, head_dim: int, seed: int, *, alpha: float = 0.7, beta: float = 0.7, sign: float = 1.0
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Mimetic init: per head A = alpha * U(+-sqrt(3/d))^{d x d} + sign * beta * I, A ~ Q K^T by truncated SVD.

    Returns (Q, K, A) with Q, K [d, heads, head_dim] and A [heads, d, d]. For the value/output pair
    the published recipe uses alpha = beta = 0.4 and sign -1.
    """
    rng = np.random.default_rng(seed)
    bound = np.sqrt(3.0 / d)
    a = alpha * rng.uniform(-bound, bound, (heads, d, d)) + sign * beta * np.eye(d)
    q = np.zeros((d, heads, head_dim))
    k = np.zeros((d, heads, head_dim))
    for h in range(heads):
        u, s, vt = np.linalg.svd(a[h])
        root = np.sqrt(s[:head_dim])
        q[:, h], k[:, h] = u[:, :head_dim] * root, vt[:head_dim].T * root
    return q, k, a


def impulse_patterns(grid: int, heads: int, kernel_size: int = 3) -> np.ndarray:
    """Shifted identities on a grid x grid patch layout: [heads, grid**2, grid**2], 0/1.

    Head i attends from patch (r, c) to (r + dr, c + dc), the offset taken from
    IMPULSE_OFFSET_ORDER[i mod 9] over the 3 x 3 kernel (4 = centre, the identity). A patch whose
    target falls off the grid attends to itself, so every row keeps one open entry.
    """
    if kernel_size != 3:
        raise ValueError("only the 3 x 3 impulse kernel of the published recipe is implemented")
    n = grid * grid
    out = np.zeros((heads, n, n))
    for h in range(heads):
        offset = IMPULSE_OFFSET_ORDER[h % 9]
        dr, dc = offset // 3 - 1, offset % 3 - 1
        for r in range(grid):
            for c in range(grid):
                rr, cc = r + dr, c + dc
                inside = 0 <= rr < grid and 0 <= cc < grid
                out[h, r * grid + c, rr * grid + cc if inside else r * grid + c] = 1.0
    return out


def pattern_error(attention_HNN: np.ndarray, pattern_HNN: np.ndarray) -> float:
    """Mean total-variation distance between attention rows and the row-normalised target, in [0, 1]."""
    target = np.asarray(pattern_HNN, np.float64)
    target = target / target.sum(-1, keepdims=True)
    return float(0.5 * np.abs(np.asarray(attention_HNN, np.float64) - target).sum(-1).mean())


def softmax_logits(x_ND: np.ndarray, q: np.ndarray, k: np.ndarray) -> np.ndarray:
    """Attention [heads, N, N] of pseudo-input x under Q, K [d, heads, head_dim]."""
    logits = np.einsum("nd,dhe,mf,fhe->hnm", x_ND, q, x_ND, k) / np.sqrt(q.shape[-1])
    logits -= logits.max(-1, keepdims=True)
    p = np.exp(logits)
    return p / p.sum(-1, keepdims=True)
