"""The Flax NNX twins of the linen modules: `NNXMaskedSelfAttention` (`maskjax.attention`'s
`MaskedSelfAttention`) and `NNXMaskBias` (`maskjax.bias`'s `MaskBias`), with the same options, parameter
layout and numerics. Apart, so that a linen model (every study here) never imports flax.nnx.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from maskjax.attention import (
    AttentionImpl,
    MaskInit,
    MaskMode,
    MaskStructure,
    as_initializer,
    attend,
    attention_path,
    biased_softmax,
    causal_mask_shape,
    check_mask_mode,
    expand_mask,
    mask_shape,
    qk_logits,
    split_qkv,
    torch_bias_init,
    torch_linear_init,
)
from maskjax.bias import BiasLayout, check_bias_mode, check_layout, with_mask_bias
from maskjax.errors import ConfigError


class FixedMask(nnx.Variable):
    """An NNX variable the optimizer does not see (filter on nnx.Param)."""


def nnx_mask_logits(
    mask_mode: MaskMode, mask_init: MaskInit | jax.Array | np.ndarray | None, shape: tuple, rngs: nnx.Rngs
) -> nnx.Variable | None:
    """The NNX twin of `linen_mask_logits`: an nnx.Param, a `FixedMask`, or None."""
    check_mask_mode(mask_mode)
    if mask_mode == "none":
        return None
    # Only a random initializer draws a key: an array or zeros consume none, so the host's later parameters
    # initialise as they would without the mask (as in linen, whose keys do not depend on call order).
    key = rngs.params() if callable(mask_init) else None
    value = as_initializer(mask_init)(key, shape, jnp.float32)
    return nnx.Param(value) if mask_mode == "learnable" else FixedMask(value)


class NNXMaskedSelfAttention(nnx.Module):
    """The NNX twin of `MaskedSelfAttention`: same options, parameter layout and numerics.

    `__call__(x, sow_weights=True)` sows the attention weights and q.k logits as `nnx.Intermediate`
    (read them with `nnx.capture(module, nnx.Intermediate)(x, sow_weights=True)`); a fixed mask is a
    `FixedMask` variable.
    """

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
        kernel_init: Callable = torch_linear_init,
        dtype: jnp.dtype | str | None = None,
        param_dtype: jnp.dtype | str = jnp.float32,
        qk_norm: bool = False,
        causal: bool = False,
        attention_impl: AttentionImpl = "auto",
        mask_structure: MaskStructure = "full",
        rngs: nnx.Rngs,
    ):
        self.heads, self.head_dim, self.mask_scale = heads, head_dim, mask_scale
        self.causal, self.attention_impl = causal, attention_impl
        dense = {"kernel_init": kernel_init, "dtype": dtype, "param_dtype": param_dtype, "rngs": rngs}
        self.qkv = nnx.LinearGeneral(features, (3, heads, head_dim), use_bias=False, **dense)
        self.out = nnx.LinearGeneral(
            (heads, head_dim),
            out_features or features,
            axis=(-2, -1),
            bias_init=torch_bias_init(heads * head_dim),
            **dense,
        )
        norm = {"epsilon": 1e-5, "param_dtype": param_dtype, "rngs": rngs}
        self.q_norm = nnx.LayerNorm(head_dim, **norm) if qk_norm else None
        self.k_norm = nnx.LayerNorm(head_dim, **norm) if qk_norm else None
        self.mask_logits = nnx_mask_logits(
            mask_mode, mask_init, causal_mask_shape(mask_structure, heads, length, causal), rngs
        )

    def __call__(self, x_BLD: jax.Array, bias: jax.Array | None = None, *, sow_weights: bool = False) -> jax.Array:
        qkv = self.qkv(x_BLD)
        q, k, v = split_qkv(qkv)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        mask = None if self.mask_logits is None else expand_mask(self.mask_logits[...], x_BLD.shape[-2])
        path = attention_path(self.attention_impl, sow_weights, bias)
        if path is not None:
            out = path(q, k, v, mask, mask_scale=self.mask_scale, causal=self.causal, bias=bias)
        else:
            logits_BHQK = qk_logits(q, k)
            biased_BHQK = logits_BHQK if bias is None else logits_BHQK + jnp.asarray(bias, logits_BHQK.dtype)
            weights = biased_softmax(biased_BHQK, mask, self.mask_scale, self.causal)
            if sow_weights:
                self.sow(nnx.Intermediate, "qk_logits", logits_BHQK)
                self.sow(nnx.Intermediate, "attention", weights)
            out = attend(weights, v)
        return self.out(out.astype(x_BLD.dtype)).astype(x_BLD.dtype)


class NNXMaskBias(nnx.Module):
    """The NNX twin of `MaskBias`: an attention_fn that owns the mask (nnx.Param, or `FixedMask` when fixed).

    attention = nnx.MultiHeadAttention(heads, features, decode=False,
                                       attention_fn=NNXMaskBias(heads, length, mask_init=prior, rngs=rngs),
                                       rngs=rngs)

    mask_structure, causal, layout: as `MaskBias`. decode: the decode steps' query positions come from
    `cache_index`, an nnx.Cache variable (as nnx.MultiHeadAttention keeps its own) that each call
    advances by its number of queries; `init_cache()` sets it to 0 for a new sequence, and
    `nnx.view(model, decode=True, ...)` switches this module too. query_positions, when given, win over it.
    """

    def __init__(
        self,
        heads: int,
        length: int,
        *,
        mask_mode: MaskMode = "learnable",
        mask_init: MaskInit | jax.Array | np.ndarray | None = None,
        mask_scale: float = 1.0,
        attention_fn: Callable = nnx.dot_product_attention,
        mask_structure: MaskStructure = "full",
        causal: bool = True,
        decode: bool = False,
        layout: BiasLayout = "BHQK",
        rngs: nnx.Rngs,
    ):
        check_bias_mode("NNXMaskBias", mask_mode)
        check_layout(layout)
        self.mask_scale, self.attention_fn = mask_scale, attention_fn
        self.mask_structure, self.causal, self.layout = mask_structure, causal, layout
        shape = mask_shape(mask_structure, heads, length, causal)
        self.mask_logits = nnx_mask_logits(mask_mode, mask_init, shape, rngs)
        self.decode = decode
        self.cache_index = nnx.data(None)
        if decode:
            self.init_cache()

    def init_cache(self, *args: object, **kwargs: object) -> None:
        """Start a new sequence: the next decode step is position 0 (arguments, as MultiHeadAttention's
        init_cache takes them, are ignored)."""
        del args, kwargs
        self.cache_index = nnx.Cache(jnp.array(0, jnp.int32))

    def set_view(self, decode: bool | None = None) -> None:
        """For `nnx.view(model, decode=...)`: switch decoding on or off (a cache index is made if none is)."""
        if decode is not None:
            self.decode = decode
            if decode and self.cache_index is None:
                self.init_cache()

    def __call__(self, query, key, value, bias=None, mask=None, *, query_positions=None, **kwargs):
        if query_positions is None and self.decode:
            if self.cache_index is None:
                raise ConfigError("NNXMaskBias has decode=True but no cache index: call init_cache() first")
            start = self.cache_index[...]
            query_positions = start + jnp.arange(query.shape[-3])
            self.cache_index[...] = start + query.shape[-3]
        biased = with_mask_bias(
            self.mask_logits[...],
            mask_scale=self.mask_scale,
            attention_fn=self.attention_fn,
            query_positions=query_positions,
            mask_structure=self.mask_structure,
            causal=self.causal,
            layout=self.layout,
        )
        return biased(query, key, value, bias=bias, mask=mask, **kwargs)
