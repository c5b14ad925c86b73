"""Attention with a learnable additive logit bias: softmax(QK^T/sqrt(d) + log_sigmoid(M)).

`masked_attention` is the whole method as one pure function. `MaskedSelfAttention`
(Flax linen) and `NNXMaskedSelfAttention` (Flax NNX) only add parameters around it,
so either can be dropped into another model with one import.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn
from flax import nnx

MaskMode = Literal["none", "learnable", "fixed"]
MaskInit = Callable[[jax.Array, tuple[int, ...], jnp.dtype], jax.Array]


def check_mask_logits(mask_logits: jax.Array | np.ndarray, heads: int, q_len: int, kv_len: int) -> None:
    """Raise ValueError unless `mask_logits` broadcasts to [heads, q_len, kv_len] and is finite.

    The finiteness check runs only on concrete arrays; under a trace it is skipped.
    """
    target = (heads, q_len, kv_len)
    shape = tuple(np.shape(mask_logits))
    try:
        if np.broadcast_shapes(shape, target) != target:
            raise ValueError
    except ValueError:
        raise ValueError(
            f"mask_logits of shape {shape} does not broadcast to [heads, q_len, kv_len] = {list(target)}"
        ) from None
    if not isinstance(mask_logits, jax.core.Tracer) and not np.all(np.isfinite(np.asarray(mask_logits))):
        raise ValueError(f"mask_logits of shape {shape} contains NaN or infinite values")


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

    causal: keys after the query get probability exactly 0 (a hard mask the learnable bias sits on top of).
    """
    if mask_logits is not None:
        check_mask_logits(mask_logits, *logits_BHQK.shape[-3:])
        dtype = logits_BHQK.dtype
        logits_BHQK = logits_BHQK + jax.nn.log_sigmoid(jnp.asarray(mask_scale, dtype) * jnp.asarray(mask_logits, dtype))
    if causal:
        q_len, kv_len = logits_BHQK.shape[-2:]
        visible = jnp.tril(jnp.ones((q_len, kv_len), bool), kv_len - q_len)
        return jax.nn.softmax(logits_BHQK, axis=-1, where=visible)
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
    causal mask (keys after the query never seen).
    Returns [batch..., q_len, heads, head_dim] in q's dtype.
    """
    weights_BHQK = attention_weights(q, k, mask_logits, mask_scale=mask_scale, causal=causal)
    return attend(weights_BHQK, v).astype(q.dtype)


def attend(weights_BHQK: jax.Array, v: jax.Array) -> jax.Array:
    """Mix values [batch..., kv_len, heads, head_dim] with attention weights, in v's dtype (at least float32 out)."""
    return jnp.einsum(
        "...hqk,...khd->...qhd",
        weights_BHQK.astype(v.dtype),
        v,
        preferred_element_type=jnp.promote_types(v.dtype, jnp.float32),
    )


def constant_init(value: jax.Array | np.ndarray) -> MaskInit:
    """An initializer that broadcasts a fixed pattern to the requested shape."""

    def init(key: jax.Array, shape: tuple[int, ...], dtype: jnp.dtype = jnp.float32) -> jax.Array:
        del key
        return jnp.broadcast_to(jnp.asarray(value, dtype), shape)

    return init


def _as_initializer(mask_init: MaskInit | jax.Array | np.ndarray | None) -> MaskInit:
    if mask_init is None:
        return nn.initializers.zeros
    if callable(mask_init):
        return mask_init
    return constant_init(mask_init)


# Matches torch.nn.Linear's default U(-1/sqrt(fan_in), 1/sqrt(fan_in)), as in the GOTU reference code.
torch_linear_init = nn.initializers.variance_scaling(1.0 / 3.0, "fan_in", "uniform")


class MaskedSelfAttention(nn.Module):
    """Multi-head self-attention with an optional per-head N x N logit bias.

    mask_mode: "none" (plain attention), "learnable" (param `mask_logits`) or "fixed"
    (a constant in the `constants` collection, which the optimizer never sees).
    mask_init: array broadcastable to [heads, N, N], or an initializer; used at init only.
    Attention weights and the unbiased q.k logits are sown into `intermediates/attention` and
    `intermediates/qk_logits` when that collection is mutable.
    dtype: of the projections (e.g. bfloat16 on accelerators); logits, bias and softmax are at least float32.
    qk_norm: LayerNorm over head_dim on queries and keys (QK-LayerNorm), which bounds the q.k logits.
    causal: a hard causal mask under the bias.
    """

    heads: int
    head_dim: int
    mask_mode: MaskMode = "none"
    mask_init: MaskInit | jax.Array | np.ndarray | None = None
    mask_scale: float = 1.0
    out_features: int | None = None
    kernel_init: Callable = torch_linear_init
    dtype: jnp.dtype | str | None = None
    qk_norm: bool = False
    causal: bool = False

    @nn.compact
    def __call__(self, x_BLD: jax.Array) -> jax.Array:
        length, features = x_BLD.shape[-2], x_BLD.shape[-1]
        qkv = nn.DenseGeneral(
            (3, self.heads, self.head_dim), use_bias=False, kernel_init=self.kernel_init, dtype=self.dtype, name="qkv"
        )(x_BLD)
        q, k, v = qkv[..., 0, :, :], qkv[..., 1, :, :], qkv[..., 2, :, :]
        if self.qk_norm:
            q = nn.LayerNorm(epsilon=1e-5, name="q_norm")(q)
            k = nn.LayerNorm(epsilon=1e-5, name="k_norm")(k)
        logits_BHQK = qk_logits(q, k)
        self.sow("intermediates", "qk_logits", logits_BHQK)
        weights = biased_softmax(logits_BHQK, self.mask_logits(length), self.mask_scale, self.causal)
        self.sow("intermediates", "attention", weights)
        out = attend(weights, v).astype(x_BLD.dtype)
        return nn.DenseGeneral(
            self.out_features or features,
            axis=(-2, -1),
            kernel_init=self.kernel_init,
            bias_init=torch_bias_init(self.heads * self.head_dim),
            dtype=self.dtype,
            name="out",
        )(out).astype(x_BLD.dtype)

    def mask_logits(self, length: int) -> jax.Array | None:
        shape = (self.heads, length, length)
        init = _as_initializer(self.mask_init)
        if self.mask_mode == "none":
            return None
        if self.mask_mode == "learnable":
            return self.param("mask_logits", init, shape, jnp.float32)
        if self.mask_mode == "fixed":
            key = self.make_rng("params") if self.is_initializing() else None
            return self.variable("constants", "mask_logits", init, key, shape, jnp.float32).value
        raise ValueError(f"unknown mask_mode {self.mask_mode!r}; expected 'none', 'learnable' or 'fixed'")


def torch_bias_init(fan_in: int) -> Callable:
    bound = 1.0 / np.sqrt(fan_in)

    def init(key: jax.Array, shape: tuple[int, ...], dtype: jnp.dtype = jnp.float32) -> jax.Array:
        return jax.random.uniform(key, shape, dtype, -bound, bound)

    return init


class FixedMask(nnx.Variable):
    """An NNX variable the optimizer does not see (filter on nnx.Param)."""


class NNXMaskedSelfAttention(nnx.Module):
    """The NNX twin of `MaskedSelfAttention`, same parameter layout and same numerics."""

    def __init__(
        self,
        features: int,
        heads: int,
        head_dim: int,
        length: int,
        *,
        mask_mode: MaskMode = "none",
        mask_init: MaskInit | jax.Array | np.ndarray | None = None,
        mask_scale: float = 1.0,
        out_features: int | None = None,
        rngs: nnx.Rngs,
    ):
        self.heads, self.head_dim, self.mask_scale = heads, head_dim, mask_scale
        self.qkv = nnx.LinearGeneral(
            features, (3, heads, head_dim), use_bias=False, kernel_init=torch_linear_init, rngs=rngs
        )
        self.out = nnx.LinearGeneral(
            (heads, head_dim),
            out_features or features,
            axis=(-2, -1),
            kernel_init=torch_linear_init,
            bias_init=torch_bias_init(heads * head_dim),
            rngs=rngs,
        )
        shape = (heads, length, length)
        if mask_mode == "none":
            self.mask_logits = None
        elif mask_mode in ("learnable", "fixed"):
            value = _as_initializer(mask_init)(rngs.params(), shape, jnp.float32)
            self.mask_logits = nnx.Param(value) if mask_mode == "learnable" else FixedMask(value)
        else:
            raise ValueError(f"unknown mask_mode {mask_mode!r}; expected 'none', 'learnable' or 'fixed'")

    def __call__(self, x_BLD: jax.Array) -> jax.Array:
        qkv = self.qkv(x_BLD)
        q, k, v = qkv[..., 0, :, :], qkv[..., 1, :, :], qkv[..., 2, :, :]
        mask = None if self.mask_logits is None else self.mask_logits[...]
        return self.out(masked_attention(q, k, v, mask, mask_scale=self.mask_scale))
