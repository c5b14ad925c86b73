"""The mask as a drop-in for attention you already use.

Flax's `linen.MultiHeadDotProductAttention` and `nnx.MultiHeadAttention` take an `attention_fn`,
and `jax.nn.dot_product_attention` takes a `bias`; log_sigmoid(M) is such a bias. Flax keeps its
own projections, dropout, sown weights and decode cache; only the logits change. docs/embedding.md
shows it in a ViT and a GPT block.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn
from flax import nnx

from maskjax.attention import MaskInit, MaskMode, linen_mask_logits, mask_bias, nnx_mask_logits
from maskjax.errors import ConfigError


def mask_rows(
    mask_logits: jax.Array, q_len: int, kv_len: int, query_positions: jax.Array | Sequence[int] | None = None
) -> jax.Array:
    """The rows of an [heads, length, length] mask that `q_len` queries against `kv_len` keys use.

    All rows when the queries are the whole sequence; `query_positions` picks them when they are
    not (a decode step at position t: [t]).
    """
    shape = tuple(mask_logits.shape)
    if len(shape) < 2 or shape[-1] != kv_len:
        raise ConfigError(f"mask_logits of shape {shape} cannot bias attention over {kv_len} keys")
    if query_positions is not None:
        positions = jnp.asarray(query_positions)
        if positions.shape != (q_len,):
            raise ConfigError(f"query_positions of shape {positions.shape} for {q_len} queries; expected ({q_len},)")
        return jnp.take(mask_logits, positions, axis=-2)
    if shape[-2] != q_len:
        raise ConfigError(
            f"mask_logits of shape {shape} cannot bias {q_len} queries against {kv_len} keys; "
            "when the queries are fewer than the mask's rows (decoding), pass query_positions"
        )
    return mask_logits


def with_mask_bias(
    mask_logits: jax.Array,
    *,
    mask_scale: float = 1.0,
    attention_fn: Callable = nn.dot_product_attention,
    query_positions: jax.Array | Sequence[int] | None = None,
) -> Callable:
    """`attention_fn` with log_sigmoid(mask_scale * mask_logits) added to its `bias`.

    The result has `attention_fn`'s signature, so linen's MultiHeadDotProductAttention passes it the
    same keyword arguments (mask, dropout, module for sown weights) it would pass `attention_fn`.
    """
    if "bias" not in inspect.signature(attention_fn).parameters:
        raise ConfigError(f"attention_fn {getattr(attention_fn, '__name__', attention_fn)!r} takes no `bias` argument")

    def biased(query, key, value, bias=None, mask=None, **kwargs):
        rows = mask_rows(mask_logits, query.shape[-3], key.shape[-3], query_positions)
        extra = mask_bias(rows, mask_scale)
        return attention_fn(query, key, value, bias=extra if bias is None else bias + extra, mask=mask, **kwargs)

    biased.__signature__ = inspect.signature(attention_fn)
    return biased


def check_bias_mode(owner: str, mask_mode: str) -> None:
    """A drop-in mask is learnable or fixed: 'none' would be the host's own attention_fn."""
    if mask_mode not in ("learnable", "fixed"):
        raise ConfigError(
            f"{owner} needs mask_mode 'learnable' or 'fixed', got {mask_mode!r}; without a mask use attention_fn"
        )


class MaskBias(nn.Module):
    """Owns the mask (param `mask_logits`, or a `constants` variable when fixed) and hands back an attention_fn.

    attention_fn = MaskBias(heads, length, mask_init=prior)()
    y = nn.MultiHeadDotProductAttention(num_heads=heads, attention_fn=attention_fn)(x)
    """

    heads: int
    length: int
    mask_mode: MaskMode = "learnable"
    mask_init: MaskInit | jax.Array | np.ndarray | None = None
    mask_scale: float = 1.0
    attention_fn: Callable = nn.dot_product_attention

    @nn.compact
    def __call__(self, query_positions: jax.Array | Sequence[int] | None = None) -> Callable:
        check_bias_mode("MaskBias", self.mask_mode)
        shape = (self.heads, self.length, self.length)
        mask_logits = linen_mask_logits(self, self.mask_mode, self.mask_init, shape)
        return with_mask_bias(
            mask_logits, mask_scale=self.mask_scale, attention_fn=self.attention_fn, query_positions=query_positions
        )


class NNXMaskBias(nnx.Module):
    """The NNX twin of `MaskBias`: an attention_fn that owns the mask (nnx.Param, or `FixedMask` when fixed).

    attention = nnx.MultiHeadAttention(heads, features, decode=False,
                                       attention_fn=NNXMaskBias(heads, length, mask_init=prior, rngs=rngs),
                                       rngs=rngs)
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
        rngs: nnx.Rngs,
    ):
        check_bias_mode("NNXMaskBias", mask_mode)
        self.mask_scale, self.attention_fn = mask_scale, attention_fn
        self.mask_logits = nnx_mask_logits(mask_mode, mask_init, (heads, length, length), rngs)

    def __call__(self, query, key, value, bias=None, mask=None, *, query_positions=None, **kwargs):
        biased = with_mask_bias(
            self.mask_logits[...],
            mask_scale=self.mask_scale,
            attention_fn=self.attention_fn,
            query_positions=query_positions,
        )
        return biased(query, key, value, bias=bias, mask=mask, **kwargs)


MASK_PARAM = "mask_logits"


def is_mask(path: Sequence, leaf: object = None) -> bool:
    """Whether a parameter-tree path (from `jax.tree_util.tree_flatten_with_path`) ends in a mask."""
    del leaf
    last = path[-1] if path else None
    return getattr(last, "key", getattr(last, "name", None)) == MASK_PARAM


def decay_mask(params: object) -> object:
    """For `optax.adamw(..., mask=maskjax.decay_mask)` (or `optax.add_decayed_weights`): True for every
    parameter except the masks, so weight decay leaves M alone whatever the host decays by default."""
    return jax.tree_util.tree_map_with_path(lambda path, leaf: not is_mask(path), params)


def with_mask_params(pretrained: dict, initialised: dict) -> dict:
    """A masked model's parameters from a pretrained checkpoint of the unmasked model: every parameter from
    `pretrained`, every mask from `initialised` (the masked model's own `init`). Anything else that differs
    is an error that names it, so a checkpoint of another model is not silently mixed in."""
    given = dict(jax.tree_util.tree_flatten_with_path(pretrained)[0])
    wanted = dict(jax.tree_util.tree_flatten_with_path(initialised)[0])
    missing = [jax.tree_util.keystr(p) for p in wanted if not is_mask(p) and p not in given]
    extra = [jax.tree_util.keystr(p) for p in given if p not in wanted]
    if missing or extra:
        parts = [
            f"missing {', '.join(missing)}" if missing else "",
            f"not in the model {', '.join(extra)}" if extra else "",
        ]
        raise ConfigError("the pretrained parameters do not fit the masked model: " + "; ".join(filter(None, parts)))
    return jax.tree_util.tree_map_with_path(lambda path, leaf: leaf if is_mask(path) else given[path], initialised)
