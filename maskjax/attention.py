"""Attention with a learnable additive logit bias: softmax(QK^T/sqrt(d) + log_sigmoid(M)).

`masked_attention` is the whole method as one pure function. `MaskedSelfAttention`
(Flax linen) and `maskjax.nnx_modules.NNXMaskedSelfAttention` (Flax NNX) only add parameters around
it, so either can be dropped into another model with one import; `maskjax.bias` puts the same
bias into Flax's own attention modules instead.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Literal, get_args

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from maskjax.errors import ConfigError

MaskMode = Literal["none", "learnable", "fixed"]
MaskInit = Callable[[jax.Array, tuple[int, ...], jnp.dtype], jax.Array]
# "fused": jax.nn.dot_product_attention with the mask as its bias (a fused kernel where the backend has
# one); "einsum": the explicit softmax the probes read; "manual": `vjp_attention`, whose backward pass is
# written out (issue 48); "auto": fused off CPU, manual on CPU (measured 1.0-1.5x faster than einsum there,
# docs/performance.md; einsum before commit c45f108, so a page's CPU numbers repeat bit for bit at its own
# commit, and to float rounding after). A bias per example (not [heads, q, k]) takes einsum on CPU. Sown
# weights always take the einsum path.
AttentionImpl = Literal["auto", "einsum", "fused", "manual"]
ATTENTION_IMPLS: tuple[str, ...] = get_args(AttentionImpl)
# "full": one logit per (head, query, key); "toeplitz": one per (head, offset i - j), as T5 and ALiBi
# parameterise relative position, expanded by `toeplitz_logits` (for causal attention).
MaskStructure = Literal["full", "toeplitz"]


def check_mask_logits(mask_logits: jax.Array | np.ndarray, heads: int, q_len: int, kv_len: int) -> None:
    """Raise ValueError unless `mask_logits` broadcasts to [heads, q_len, kv_len]; host arrays must be finite.

    Values are checked only for host (numpy) arrays: reading a device array would copy it to the host
    on every eager call. Device masks are checked where they enter, at init (`constant_init`).
    """
    target = (heads, q_len, kv_len)
    shape = tuple(np.shape(mask_logits))
    try:
        if np.broadcast_shapes(shape, target) != target:
            raise ValueError
    except ValueError:
        raise ConfigError(
            f"mask_logits of shape {shape} does not broadcast to [heads, q_len, kv_len] = {list(target)}"
        ) from None
    if not isinstance(mask_logits, jax.Array):
        check_finite(mask_logits)


def check_finite(mask_logits: jax.Array | np.ndarray) -> None:
    """Raise ValueError if a concrete mask is not numbers, or holds NaN or inf (a no-op under a trace)."""
    if isinstance(mask_logits, jax.core.Tracer):
        return
    values = np.asarray(mask_logits)
    if not (np.issubdtype(values.dtype, np.number) or values.dtype == bool):
        raise ConfigError(
            f"a mask must be an array of numbers (or an initializer function), got {type(mask_logits).__name__} "
            f"of dtype {values.dtype}"
        )
    if not np.all(np.isfinite(values)):
        raise ConfigError(f"mask_logits of shape {tuple(np.shape(mask_logits))} contains NaN or infinite values")


def mask_bias(mask_logits: jax.Array | np.ndarray, mask_scale: float | jax.Array = 1.0, dtype=jnp.float32) -> jax.Array:
    """log_sigmoid(mask_scale * mask_logits): the additive logit bias, <= 0, for any attention taking a `bias`."""
    return jax.nn.log_sigmoid(jnp.asarray(mask_scale, dtype) * jnp.asarray(mask_logits, dtype))


def toeplitz_logits(relative_HD: jax.Array, q_len: int, kv_len: int) -> jax.Array:
    """M[h, i, j] = m[h, i - j + kv_len - q_len] from one logit per head and offset, relative_HD [heads, kv_len].

    Entries above the causal diagonal (negative offsets) take offset 0's value: a causal mask hides them,
    so they never reach the softmax or the gradient. The causal case of `relative_logits`, queries at the
    last q_len positions."""
    return relative_logits(relative_HD, q_len, kv_len)[0]


def relative_logits(
    relative_HR: jax.Array, q_len: int, kv_len: int, query_positions: jax.Array | None = None, *, causal: bool = True
) -> tuple[jax.Array, jax.Array | None]:
    """M[h, i, j] from one logit per head and relative distance, for any q_len, kv_len up to the mask's length.

    Why: a relative mask serves every sequence length and a decode step, where a full [heads, N, N] mask
    serves length N only. causal: relative_HR is [heads, length], distances i - j = 0..length - 1 to the
    past; the second value is the [q_len, kv_len] Boolean of visible (past or present) keys, since the mask
    holds no logit for a future key. Not causal: relative_HR is [heads, 2 * length - 1], offsets
    -(length - 1)..length - 1 (index offset + length - 1), each future offset its own logit; the second value
    is None. Keys sit at positions 0..kv_len - 1; queries at `query_positions` ([q_len], e.g. a decode
    step's cache index), or by default at the last q_len positions (the whole sequence when q_len == kv_len).
    Positions a traced value puts past the mask's length take its last logit (nothing can raise under jit)."""
    size = relative_HR.shape[-1]
    if not causal and size % 2 == 0:
        raise ConfigError(
            f"a non-causal relative mask holds 2 * length - 1 offsets (an odd number), got {size}: "
            f"relative mask of shape {tuple(relative_HR.shape)}"
        )
    length = size if causal else (size + 1) // 2
    if kv_len > length:
        raise ConfigError(
            f"a relative mask (mask_structure='toeplitz') of length {length} (shape {tuple(relative_HR.shape)}) "
            f"cannot cover {kv_len} keys; build it with length >= the longest sequence or cache"
        )
    if query_positions is None:
        if q_len > kv_len:
            raise ConfigError(f"{q_len} queries against {kv_len} keys need query_positions")
        positions = jnp.arange(q_len) + (kv_len - q_len)
    else:
        positions = jnp.asarray(query_positions)
        if positions.shape != (q_len,):
            raise ConfigError(f"query_positions of shape {positions.shape} for {q_len} queries; expected ({q_len},)")
    offsets = positions[:, None] - jnp.arange(kv_len)[None, :]
    if causal:
        return relative_HR[..., jnp.clip(offsets, 0, length - 1)], offsets >= 0
    return relative_HR[..., jnp.clip(offsets + length - 1, 0, size - 1)], None


def extend_relative_mask(relative_HR: jax.Array | np.ndarray, length: int, *, causal: bool = True) -> jax.Array:
    """A trained relative mask (mask_structure='toeplitz') made to serve sequences up to `length`.

    Why: a relative mask of length N holds no logit for distances of N or more. The new distances start
    at the logit of the farthest distance the mask was trained on (causal: distance N - 1; not causal:
    offsets +-(N - 1)), which is also what `relative_logits` reads for a traced position past the mask, so
    a trained recency prior keeps its far value rather than reopening. causal: [heads, N] -> [heads, length];
    not causal: [heads, 2 N - 1] -> [heads, 2 length - 1]. Shorter lengths are refused (cut it yourself)."""
    relative_HR = jnp.asarray(relative_HR)
    if relative_HR.ndim != 2:
        raise ConfigError(f"a relative mask is [heads, offsets], got shape {tuple(relative_HR.shape)}")
    size = relative_HR.shape[-1]
    if not causal and size % 2 == 0:
        raise ConfigError(f"a non-causal relative mask holds 2 * length - 1 offsets (an odd number), got {size}")
    old = size if causal else (size + 1) // 2
    if length < old:
        raise ConfigError(f"cannot extend a relative mask of length {old} to the shorter length {length}")
    grow = length - old
    return jnp.pad(relative_HR, ((0, 0), (0 if causal else grow, grow)), mode="edge")


def alibi_bias(heads: int, length: int, slopes: np.ndarray | None = None) -> np.ndarray:
    """ALiBi's fixed bias -slope_h * (i - j) [heads, length, length] (Press et al. 2022): by default slopes
    2^(-8 (h + 1) / heads), the geometric sequence of the paper; future keys get 0 (a causal mask hides them)."""
    slopes = 2.0 ** (-8.0 * np.arange(1, heads + 1) / heads) if slopes is None else np.asarray(slopes, np.float64)
    if slopes.shape != (heads,):
        raise ConfigError(f"ALiBi needs one slope per head ({heads}), got shape {slopes.shape}")
    distance = np.maximum(np.arange(length)[:, None] - np.arange(length)[None, :], 0)
    return (-slopes[:, None, None] * distance).astype(np.float32)


def qk_logits(q: jax.Array, k: jax.Array) -> jax.Array:
    """q.k / sqrt(head_dim) as [batch..., heads, q_len, kv_len], in at least float32."""
    dtype = jnp.promote_types(jnp.result_type(q.dtype, k.dtype), jnp.float32)
    logits_BHQK = jnp.einsum("...qhd,...khd->...hqk", q, k, preferred_element_type=dtype)
    return logits_BHQK / jnp.sqrt(jnp.asarray(q.shape[-1], dtype))


def attention_weights(
    q: jax.Array,
    k: jax.Array,
    mask_logits: jax.Array | None = None,
    *,
    mask_scale: float | jax.Array = 1.0,
    causal: bool = False,
) -> jax.Array:
    """Attention probabilities [batch..., heads, q_len, kv_len] for q, k in [batch..., length, heads, head_dim].

    Computed in at least float32, so bfloat16 projections keep a float32 softmax.
    """
    return biased_softmax(qk_logits(q, k), mask_logits, mask_scale, causal)


def biased_softmax(
    logits_BHQK: jax.Array, mask_logits: jax.Array | None, mask_scale: float | jax.Array = 1.0, causal: bool = False
) -> jax.Array:
    """softmax(logits + log_sigmoid(mask_scale * mask_logits)) over the keys; plain softmax without a mask.

    causal: keys after the query get probability exactly 0 (a hard mask the learnable bias sits on top of),
    aligned bottom-right: with fewer queries than keys, query i sits at key position kv_len - q_len + i.
    """
    if mask_logits is not None:
        check_mask_logits(mask_logits, *logits_BHQK.shape[-3:])
        logits_BHQK = logits_BHQK + mask_bias(mask_logits, mask_scale, logits_BHQK.dtype)
    if causal:
        return jax.nn.softmax(logits_BHQK, axis=-1, where=causal_visible(*logits_BHQK.shape[-2:]))
    return jax.nn.softmax(logits_BHQK, axis=-1)


def masked_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    mask_logits: jax.Array | None = None,
    *,
    mask_scale: float | jax.Array = 1.0,
    causal: bool = False,
) -> jax.Array:
    """softmax(q.k / sqrt(head_dim) + log_sigmoid(mask_scale * mask_logits)) @ v.

    q, k, v: [batch..., length, heads, head_dim] (Flax layout). mask_logits broadcasts to
    [heads, q_len, kv_len]; None gives plain attention. log_sigmoid <= 0, so the bias can only
    close entries; a row with every entry closed is uniform again after softmax. causal adds a hard
    causal mask (keys after the query never seen), aligned bottom-right: with fewer queries than keys (a
    decode step against its cache) query i sits at key position kv_len - q_len + i; `fused_attention` and
    the drop-ins in `maskjax.bias` align it the same way.
    Returns [batch..., q_len, heads, head_dim] in q's dtype.
    """
    weights_BHQK = attention_weights(q, k, mask_logits, mask_scale=mask_scale, causal=causal)
    return attend(weights_BHQK, v).astype(q.dtype)


def fused_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    mask_logits: jax.Array | None = None,
    *,
    mask_scale: float | jax.Array = 1.0,
    causal: bool = False,
    bias: jax.Array | None = None,
) -> jax.Array:
    """`masked_attention` through jax.nn.dot_product_attention, the mask (plus any fixed `bias`) as its bias
    (same numbers to float rounding; the backend may fuse it). The bias is log_sigmoid(s * M) computed in
    float32, as on the unfused path, and only then cast to the inputs' dtype. q: [batch..., q_len, heads,
    head_dim], k and v: [batch..., kv_len, heads, head_dim].

    causal: aligned bottom-right, as `masked_attention`: query i sits at key position kv_len - q_len + i
    (cached decoding), not top-left as jax.nn.dot_product_attention(is_causal=True) aligns fewer queries.
    bias: broadcastable to [heads, q_len, kv_len], or to [batch..., heads, q_len, kv_len] (per example)."""
    lead, (q_len, heads, _) = q.shape[:-3], q.shape[-3:]
    kv_len = k.shape[-3]
    q4, k4, v4 = (a.reshape((-1, *a.shape[-3:])) for a in (q, k, v))
    shape = (1, heads, q_len, kv_len)
    total = None if bias is None else per_example_bias(jnp.asarray(bias, q.dtype), lead, shape)
    if mask_logits is not None:
        check_mask_logits(mask_logits, heads, q_len, kv_len)
        masked = jnp.broadcast_to(mask_bias(mask_logits, mask_scale).astype(q.dtype), shape)
        total = masked if total is None else total + masked
    # is_causal aligns top-left; with fewer queries than keys the bottom-right mask is passed explicitly.
    visible = causal_visible(q_len, kv_len)[None, None] if causal and q_len != kv_len else None
    out = jax.nn.dot_product_attention(q4, k4, v4, bias=total, mask=visible, is_causal=causal and q_len == kv_len)
    return out.reshape((*lead, *out.shape[1:]))


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def vjp_attention(
    q_BHQD: jax.Array, k_BHKD: jax.Array, v_BHKD: jax.Array, bias_HQK: jax.Array | None, causal: bool
) -> jax.Array:
    """softmax(q.k / sqrt(d) + bias) @ v in the [batch, heads, length, head_dim] layout, with a backward pass
    written out (issue 48): it keeps the forward's probabilities and computes dV, dP, dS, dQ, dK and the bias's
    gradient (dS summed over the batch) as plain contractions, instead of what autodiff derives. Equal to
    autodiff of `masked_attention` to float rounding (tests/test_attention.py, float64). bias: [heads, q, k]
    shared by the batch (the mask's log_sigmoid and any fixed bias), or None."""
    return _vjp_forward(q_BHQD, k_BHKD, v_BHKD, bias_HQK, causal)[0]


def _vjp_forward(q, k, v, bias, causal):
    dtype = jnp.promote_types(jnp.result_type(q.dtype, k.dtype), jnp.float32)
    scale = 1.0 / np.sqrt(q.shape[-1])
    logits = jnp.einsum("bhqd,bhkd->bhqk", q, k, preferred_element_type=dtype) * scale
    if bias is not None:
        logits = logits + bias.astype(dtype)
    visible = causal_visible(*logits.shape[-2:]) if causal else None
    p = jax.nn.softmax(logits, axis=-1, where=visible)
    out = jnp.einsum("bhqk,bhkd->bhqd", p.astype(v.dtype), v, preferred_element_type=jnp.promote_types(v.dtype, dtype))
    return out.astype(q.dtype), (q, k, v, p, bias)


def _vjp_backward(causal, residuals, g_BHQD):
    q, k, v, p, bias = residuals
    scale = 1.0 / np.sqrt(q.shape[-1])
    g = g_BHQD.astype(p.dtype)
    dv = jnp.einsum("bhqk,bhqd->bhkd", p, g).astype(v.dtype)
    dp = jnp.einsum("bhqd,bhkd->bhqk", g, v.astype(p.dtype))
    ds = p * (dp - jnp.sum(dp * p, axis=-1, keepdims=True))  # masked keys have p = 0, so ds = 0 there
    dq = (jnp.einsum("bhqk,bhkd->bhqd", ds, k.astype(p.dtype)) * scale).astype(q.dtype)
    dk = (jnp.einsum("bhqk,bhqd->bhkd", ds, q.astype(p.dtype)) * scale).astype(k.dtype)
    return dq, dk, dv, None if bias is None else ds.sum(0).astype(bias.dtype)


vjp_attention.defvjp(_vjp_forward, _vjp_backward)


def manual_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    mask_logits: jax.Array | None = None,
    *,
    mask_scale: float | jax.Array = 1.0,
    causal: bool = False,
    bias: jax.Array | None = None,
) -> jax.Array:
    """`masked_attention` through `vjp_attention` (the hand-written backward): q, k, v in the Flax layout
    [batch..., length, heads, head_dim]; the mask's log_sigmoid plus any fixed `bias` (broadcastable to
    [heads, q_len, kv_len]) enter as one bias, and autodiff carries its gradient on to M (through the Toeplitz
    gather for a relative mask)."""
    lead, (q_len, heads, head_dim) = q.shape[:-3], q.shape[-3:]
    kv_len, dtype = k.shape[-3], jnp.promote_types(q.dtype, jnp.float32)
    if bias is not None and jnp.ndim(bias) > 3:
        raise ConfigError(
            f"the manual attention path takes a bias shared by the batch ([heads, q, k]), got shape {jnp.shape(bias)}"
        )
    total = None if bias is None else jnp.broadcast_to(jnp.asarray(bias, dtype), (heads, q_len, kv_len))
    if mask_logits is not None:
        check_mask_logits(mask_logits, heads, q_len, kv_len)
        masked = jnp.broadcast_to(mask_bias(mask_logits, mask_scale, dtype), (heads, q_len, kv_len))
        total = masked if total is None else total + masked
    q4, k4, v4 = (jnp.swapaxes(a.reshape((-1, *a.shape[-3:])), 1, 2) for a in (q, k, v))
    out = vjp_attention(q4, k4, v4, total, causal)
    return jnp.swapaxes(out, 1, 2).reshape((*lead, q_len, heads, head_dim))


def causal_visible(q_len: int, kv_len: int) -> jax.Array:
    """[q_len, kv_len] Boolean of the keys each query sees: query i at key position kv_len - q_len + i. More
    queries than keys are refused: the first would see no key."""
    if q_len > kv_len:
        raise ConfigError(f"causal attention of {q_len} queries against {kv_len} keys: a query would see no key")
    return jnp.tril(jnp.ones((q_len, kv_len), bool), kv_len - q_len)


def per_example_bias(bias: jax.Array, lead: tuple[int, ...], shape: tuple[int, int, int, int]) -> jax.Array:
    """A bias as jax.nn.dot_product_attention takes it, [1 or batch, heads, q, k]: [heads, q, k] (or fewer
    axes) shared by every example, or [batch..., heads, q, k] flattened to the reshaped batch."""
    if bias.ndim <= 3:
        return jnp.broadcast_to(bias, shape)
    try:
        full = jnp.broadcast_to(bias, (*lead, *shape[1:]))
    except ValueError:
        raise ConfigError(
            f"bias of shape {tuple(bias.shape)} does not broadcast to [batch..., heads, q_len, kv_len] = "
            f"{[*lead, *shape[1:]]}"
        ) from None
    return full.reshape((-1, *shape[1:]))


def attend(weights_BHQK: jax.Array, v: jax.Array) -> jax.Array:
    """Mix values [batch..., kv_len, heads, head_dim] with attention weights, in v's dtype (at least float32 out)."""
    return jnp.einsum(
        "...hqk,...khd->...qhd",
        weights_BHQK.astype(v.dtype),
        v,
        preferred_element_type=jnp.promote_types(v.dtype, jnp.float32),
    )


def constant_init(value: jax.Array | np.ndarray) -> MaskInit:
    """An initializer that broadcasts a fixed pattern to the requested shape; refuses NaN / inf once, here."""
    check_finite(value)

    def init(key: jax.Array, shape: tuple[int, ...], dtype: jnp.dtype = jnp.float32) -> jax.Array:
        del key
        value_shape = tuple(np.shape(value))
        try:
            np.broadcast_to(np.empty(value_shape, bool), shape)
        except ValueError:
            target = f"[heads, q_len, kv_len] = {list(shape)}"
            raise ConfigError(f"mask_init of shape {value_shape} does not broadcast to the mask's {target}") from None
        return jnp.broadcast_to(jnp.asarray(value, dtype), shape)

    return init


def as_initializer(mask_init: MaskInit | jax.Array | np.ndarray | None) -> MaskInit:
    """None -> zeros, an array -> `constant_init` of it, a callable -> itself."""
    if mask_init is None:
        return nn.initializers.zeros
    if callable(mask_init):
        return mask_init
    return constant_init(mask_init)


def check_mask_mode(mask_mode: str) -> None:
    if mask_mode not in ("none", "learnable", "fixed"):
        raise ConfigError(f"unknown mask_mode {mask_mode!r}; expected 'none', 'learnable' or 'fixed'")


def linen_mask_logits(
    module: nn.Module, mask_mode: MaskMode, mask_init: MaskInit | jax.Array | np.ndarray | None, shape: tuple
) -> jax.Array | None:
    """The mask of a linen module: param `mask_logits` (learnable), a `constants` variable (fixed), or None.

    Always float32: the logits sit near +-10, where a bfloat16 step is 0.06."""
    check_mask_mode(mask_mode)
    if mask_mode == "none":
        return None
    collection = "params" if mask_mode == "learnable" else "constants"
    if module.has_variable(collection, "mask_logits"):
        stored = tuple(module.get_variable(collection, "mask_logits").shape)
        if stored != tuple(shape):
            raise ConfigError(
                f"mask_logits of shape {stored} cannot bias this input: it needs [heads, q_len, kv_len] = {list(shape)}"
            )
    init = as_initializer(mask_init)
    if mask_mode == "learnable":
        return module.param("mask_logits", init, shape, jnp.float32)
    key = module.make_rng("params") if module.is_initializing() else None
    return module.variable("constants", "mask_logits", init, key, shape, jnp.float32).value


def mask_shape(mask_structure: MaskStructure, heads: int, length: int, causal: bool = True) -> tuple[int, ...]:
    """The stored shape of a mask: [heads, N, N] (full), [heads, N] (causal relative: distances 0..N - 1) or
    [heads, 2 N - 1] (relative, a logit per past and future offset)."""
    if mask_structure == "full":
        return (heads, length, length)
    if mask_structure == "toeplitz":
        return (heads, length) if causal else (heads, 2 * length - 1)
    raise ConfigError(f"unknown mask_structure {mask_structure!r}; expected 'full' or 'toeplitz'")


def causal_mask_shape(mask_structure: MaskStructure, heads: int, length: int, causal: bool) -> tuple[int, ...]:
    """`mask_shape` for this module's attention layers, whose relative mask (`toeplitz_logits`) holds offsets
    i - j >= 0 only and so needs a causal model: without one, future keys would be biased by the diagonal's
    logit."""
    if mask_structure == "toeplitz" and not causal:
        raise ConfigError(
            "mask_structure='toeplitz' holds one logit per offset i - j >= 0 and so needs causal=True; "
            "use mask_structure='full' for attention that sees future keys"
        )
    return mask_shape(mask_structure, heads, length, causal)


def expand_mask(mask_logits: jax.Array | None, length: int) -> jax.Array | None:
    """A stored mask as [heads, N, N]: a Toeplitz one ([heads, N]) expanded, a full one as it is."""
    if mask_logits is None or mask_logits.ndim == 3:
        return mask_logits
    return toeplitz_logits(mask_logits, length, length)


def split_qkv(qkv: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """q, k, v from one projection [..., 3, heads, head_dim]. A split, not three indexings: the gradient of a
    split is one concatenation, where indexing pads each part to the whole and adds the three (the same
    floats, and fewer kernels; docs/performance.md)."""
    q, k, v = (jnp.squeeze(part, -3) for part in jnp.split(qkv, 3, axis=-3))
    return q, k, v


def attention_path(attention_impl: AttentionImpl, sowing: bool, bias: jax.Array | None = None) -> Callable | None:
    """The function a module's attention runs through (`fused_attention`, `manual_attention`), or None for the
    einsum path the sown weights need. bias: the fixed bias the call adds; one per example ([batch..., heads,
    q, k]) keeps `auto` off the manual path, which takes a bias shared by the batch."""
    if attention_impl not in ATTENTION_IMPLS:
        raise ConfigError(
            f"unknown attention_impl {attention_impl!r}; expected 'auto', 'einsum', 'fused' or 'manual'"
        )
    if sowing or attention_impl == "einsum":
        return None
    if attention_impl == "manual":
        return manual_attention
    if attention_impl == "fused" or jax.default_backend() != "cpu":
        return fused_attention
    return manual_attention if bias is None or jnp.ndim(bias) <= 3 else None


# Matches torch.nn.Linear's default U(-1/sqrt(fan_in), 1/sqrt(fan_in)), as in the GOTU reference code.
torch_linear_init = nn.initializers.variance_scaling(1.0 / 3.0, "fan_in", "uniform")


def torch_bias_init(fan_in: int) -> Callable:
    bound = 1.0 / np.sqrt(fan_in)

    def init(key: jax.Array, shape: tuple[int, ...], dtype: jnp.dtype = jnp.float32) -> jax.Array:
        return jax.random.uniform(key, shape, dtype, -bound, bound)

    return init


class MaskedSelfAttention(nn.Module):
    """Multi-head self-attention with an optional per-head N x N logit bias.

    mask_mode: "none" (plain attention), "learnable" (param `mask_logits`) or "fixed"
    (a constant in the `constants` collection, which the optimizer never sees; `apply` needs
    `{"params": ..., "constants": ...}`, as `init` returns them).
    mask_init: array broadcastable to [heads, N, N], or an initializer; used at init only.
    Attention weights and the unbiased q.k logits are sown into `intermediates/attention` and
    `intermediates/qk_logits` when that collection is mutable.
    dtype: of the computation (e.g. bfloat16 on accelerators); logits, bias and softmax are at least
    float32, and the output has the input's dtype. param_dtype: of the projections; the mask is float32.
    qk_norm: LayerNorm over head_dim on queries and keys (QK-LayerNorm), which bounds the q.k logits.
    causal: a hard causal mask under the bias.
    attention_impl: see `AttentionImpl`.
    mask_structure: see `MaskStructure`; "toeplitz" keeps `mask_logits` as [heads, N] (one per offset).
    `__call__(x, bias=None)`: bias, broadcastable to [heads, N, N], is a fixed logit bias added beside the
    mask (ALiBi, or a mask shared across layers that the caller owns).
    """

    heads: int
    head_dim: int
    mask_mode: MaskMode = "none"
    mask_init: MaskInit | jax.Array | np.ndarray | None = None
    mask_scale: float = 1.0
    out_features: int | None = None
    kernel_init: Callable = torch_linear_init
    dtype: jnp.dtype | str | None = None
    param_dtype: jnp.dtype | str = jnp.float32
    qk_norm: bool = False
    causal: bool = False
    attention_impl: AttentionImpl = "auto"
    mask_structure: MaskStructure = "full"

    @nn.compact
    def __call__(self, x_BLD: jax.Array, bias: jax.Array | None = None) -> jax.Array:
        length, features = x_BLD.shape[-2], x_BLD.shape[-1]
        dense = {"kernel_init": self.kernel_init, "dtype": self.dtype, "param_dtype": self.param_dtype}
        qkv = nn.DenseGeneral((3, self.heads, self.head_dim), use_bias=False, name="qkv", **dense)(x_BLD)
        q, k, v = split_qkv(qkv)
        if self.qk_norm:
            q = nn.LayerNorm(epsilon=1e-5, param_dtype=self.param_dtype, name="q_norm")(q)
            k = nn.LayerNorm(epsilon=1e-5, param_dtype=self.param_dtype, name="k_norm")(k)
        shape = causal_mask_shape(self.mask_structure, self.heads, length, self.causal)
        mask_logits = expand_mask(linen_mask_logits(self, self.mask_mode, self.mask_init, shape), length)
        path = attention_path(self.attention_impl, self.is_mutable_collection("intermediates"), bias)
        if path is not None:
            out = path(q, k, v, mask_logits, mask_scale=self.mask_scale, causal=self.causal, bias=bias)
        else:
            logits_BHQK = qk_logits(q, k)
            self.sow("intermediates", "qk_logits", logits_BHQK)
            biased_BHQK = logits_BHQK if bias is None else logits_BHQK + jnp.asarray(bias, logits_BHQK.dtype)
            weights = biased_softmax(biased_BHQK, mask_logits, self.mask_scale, self.causal)
            self.sow("intermediates", "attention", weights)
            out = attend(weights, v)
        out = nn.DenseGeneral(
            self.out_features or features,
            axis=(-2, -1),
            bias_init=torch_bias_init(self.heads * self.head_dim),
            name="out",
            **dense,
        )(out.astype(x_BLD.dtype))
        return out.astype(x_BLD.dtype)
