"""The mask as a drop-in for attention you already use.

Flax's `linen.MultiHeadDotProductAttention` and `nnx.MultiHeadAttention` take an `attention_fn`,
and `jax.nn.dot_product_attention` takes a `bias`; log_sigmoid(M) is such a bias. Flax keeps its
own projections, dropout, sown weights and decode cache; only the logits change. docs/embedding.md
shows it in a ViT and a GPT block.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Literal

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import linen as nn

from maskjax.attention import (
    MaskInit,
    MaskMode,
    MaskStructure,
    as_initializer,
    linen_mask_logits,
    mask_bias,
    mask_shape,
    relative_logits,
)
from maskjax.errors import ConfigError

# The bias's axes after its batch axis, by the name a host gives its logits: Flax and jax.nn.dot_product_attention
# take [batch, heads, q, k] ("BHQK", which Gemma would spell "BNTS"); Gemma's own logits are [B, T, N, S]
# (batch, query time, heads, source keys: "BTNS", the same as "BQHK").
BiasLayout = Literal["BHQK", "BNTS", "BQHK", "BTNS"]
LAYOUT_AXES = {"BHQK": "HQK", "BNTS": "HQK", "BQHK": "QHK", "BTNS": "QHK"}
# Where a fixed mask lives: the `constants` collection (no optimizer sees it), or `params` (for hosts whose
# train state keeps params only) as `fixed_mask_logits` behind jax.lax.stop_gradient.
MaskCollection = Literal["constants", "params"]
# The bias of a key a causal relative mask hides (it holds no logit for future keys); as Flax's own masking.
HIDDEN = float(np.finfo(np.float32).min)


def mask_rows(
    mask_logits: jax.Array, q_len: int, kv_len: int, query_positions: jax.Array | Sequence[int] | None = None
) -> jax.Array:
    """The rows of an [heads, length, length] mask that `q_len` queries against `kv_len` keys use.

    All rows when the queries are the whole sequence; `query_positions` picks them when they are
    not (a decode step at position t: [t]).
    """
    shape = tuple(mask_logits.shape)
    fixed = (
        f"a full mask (mask_structure='full') has the fixed length {shape[-1] if shape else '?'}; for any length up "
        "to the mask's, use mask_structure='toeplitz' (one logit per head and relative distance)"
    )
    if len(shape) < 2 or shape[-1] != kv_len:
        raise ConfigError(f"mask_logits of shape {shape} cannot bias attention over {kv_len} keys: {fixed}")
    if query_positions is not None:
        positions = jnp.asarray(query_positions)
        if positions.shape != (q_len,):
            raise ConfigError(f"query_positions of shape {positions.shape} for {q_len} queries; expected ({q_len},)")
        return jnp.take(mask_logits, positions, axis=-2)
    if shape[-2] != q_len:
        raise ConfigError(
            f"mask_logits of shape {shape} cannot bias {q_len} queries against {kv_len} keys; "
            f"when the queries are fewer than the mask's rows (decoding), pass query_positions; {fixed}"
        )
    return mask_logits


def check_layout(layout: str) -> str:
    """The order of a layout's heads, query and key axes ("HQK" or "QHK"); an unknown name is refused."""
    if layout not in LAYOUT_AXES:
        raise ConfigError(f"unknown layout {layout!r}; expected one of {', '.join(map(repr, LAYOUT_AXES))}")
    return LAYOUT_AXES[layout]


def bias_layout(bias_HQK: jax.Array, layout: BiasLayout = "BHQK") -> jax.Array:
    """A [heads, q, k] bias in a host's logits layout, with a batch axis of 1: [1, H, Q, K] or [1, Q, H, K].

    Why: adding a [H, Q, K] bias to [B, T, N, S] logits broadcasts without error whenever heads and lengths
    coincide, and biases the wrong axes; naming the layout makes the axes explicit. A [q, k] bias (shared by
    every head) gets a heads axis of 1; any other rank is refused."""
    axes = check_layout(layout)
    bias = jnp.asarray(bias_HQK)
    if bias.ndim == 2:
        bias = bias[None]
    if bias.ndim != 3:
        raise ConfigError(
            f"a bias of shape {tuple(bias.shape)} is not [heads, q_len, kv_len] (nor [q_len, kv_len]); "
            f"layout {layout!r} adds the batch axis itself"
        )
    return (bias if axes == "HQK" else jnp.swapaxes(bias, 0, 1))[None]


def mask_heads(mask_logits: jax.Array | np.ndarray, mask_structure: MaskStructure = "full") -> int:
    """How many heads a stored mask has (1: shared by every head), checking its rank for its structure."""
    shape = tuple(np.shape(mask_logits))
    if mask_structure == "toeplitz":
        if len(shape) != 2:
            raise ConfigError(f"a relative mask (mask_structure='toeplitz') is [heads, offsets], got shape {shape}")
        return shape[0]
    if mask_structure != "full":
        raise ConfigError(f"unknown mask_structure {mask_structure!r}; expected 'full' or 'toeplitz'")
    if len(shape) not in (2, 3):
        raise ConfigError(f"a full mask is [heads, q_len, kv_len] (or [q_len, kv_len]), got shape {shape}")
    return shape[0] if len(shape) == 3 else 1


def check_heads(mask_logits: jax.Array | np.ndarray, mask_structure: MaskStructure, heads: int) -> None:
    """Refuse a mask whose heads are neither 1 nor the host's, before a broadcast error (or a silent one)."""
    have = mask_heads(mask_logits, mask_structure)
    if have not in (1, heads):
        raise ConfigError(f"a mask of shape {tuple(np.shape(mask_logits))} has {have} heads; the attention has {heads}")


def attention_bias(
    mask_logits: jax.Array,
    q_len: int,
    kv_len: int,
    *,
    mask_structure: MaskStructure = "full",
    causal: bool = True,
    mask_scale: float = 1.0,
    query_positions: jax.Array | Sequence[int] | None = None,
    layout: BiasLayout = "BHQK",
) -> jax.Array:
    """log_sigmoid(mask_scale * M) for q_len queries against kv_len keys, as [1, H, Q, K] (or [1, Q, H, K]).

    Why: one place turns a stored mask into the bias a host adds to its logits. mask_structure='full': M is
    [heads, N, N] and serves length N only (decode steps pick rows by query_positions). 'toeplitz': M is
    relative ([heads, length] when causal, [heads, 2 * length - 1] when not; see
    `maskjax.attention.relative_logits`) and serves any length up to `length`; a causal one gives future
    keys the bias HIDDEN (it holds no logit for them), so they stay hidden even if the host passes no mask.
    `causal` is read for 'toeplitz' only."""
    if mask_structure == "toeplitz":
        positions = None if query_positions is None else jnp.asarray(query_positions)
        logits, visible = relative_logits(jnp.asarray(mask_logits), q_len, kv_len, positions, causal=causal)
        bias = mask_bias(logits, mask_scale)
        if visible is not None:
            bias = jnp.where(visible, bias, HIDDEN)
    else:
        mask_heads(mask_logits, mask_structure)
        bias = mask_bias(mask_rows(mask_logits, q_len, kv_len, query_positions), mask_scale)
    return bias_layout(bias, layout)


def add_attention_bias(
    logits: jax.Array,
    mask_logits: jax.Array,
    *,
    layout: BiasLayout,
    mask_structure: MaskStructure = "full",
    causal: bool = True,
    mask_scale: float = 1.0,
    query_positions: jax.Array | Sequence[int] | None = None,
) -> jax.Array:
    """logits + the mask's bias, for a host that computes its own [batch, ., ., kv] attention logits.

    Why: a host such as Gemma holds logits as [B, T, N, S] (layout="BTNS"), Flax as [B, H, Q, K]
    (layout="BHQK"). The layout is a required name, never guessed from shapes (with heads == length both
    orders fit and a guess would be silently wrong); heads, queries and keys are read from the axes it names
    and checked against the mask. The sum is at least float32."""
    check_layout(layout)
    if np.ndim(logits) != 4:
        raise ConfigError(f"attention logits of shape {tuple(np.shape(logits))} are not 4-D; layout {layout!r}")
    options = {
        "mask_structure": mask_structure,
        "causal": causal,
        "mask_scale": mask_scale,
        "query_positions": query_positions,
    }
    try:
        bias = layout_bias(logits.shape, mask_logits, layout, **options)
    except ConfigError as e:
        fitting = [name for name in LAYOUT_AXES if name != layout and fits(logits.shape, mask_logits, name, options)]
        hint = f"; layout {' or '.join(map(repr, fitting))} would fit" if fitting else ""
        raise ConfigError(f"{e} (logits {tuple(logits.shape)} read as {layout!r}{hint})") from None
    return logits.astype(jnp.promote_types(logits.dtype, jnp.float32)) + bias


def layout_bias(shape: Sequence[int], mask_logits: jax.Array, layout: BiasLayout, **options: object) -> jax.Array:
    """The bias for logits of `shape` read in `layout`: heads and queries from the axes it names."""
    _, first, second, kv_len = shape
    heads, q_len = (first, second) if LAYOUT_AXES[layout] == "HQK" else (second, first)
    check_heads(mask_logits, options["mask_structure"], heads)
    return attention_bias(mask_logits, q_len, kv_len, layout=layout, **options)


def fits(shape: Sequence[int], mask_logits: jax.Array, layout: BiasLayout, options: dict) -> bool:
    """Whether the mask fits logits of `shape` read in `layout` (for the hint of a refused layout)."""
    try:
        jax.eval_shape(lambda m: layout_bias(shape, m, layout, **options), jnp.asarray(mask_logits))
    except ConfigError:
        return False
    return True


def biased_attention_fn(
    mask_logits: jax.Array,
    attention_fn: Callable,
    positions: Callable[[int], jax.Array | Sequence[int] | None],
    *,
    mask_scale: float = 1.0,
    mask_structure: MaskStructure = "full",
    causal: bool = True,
    layout: BiasLayout = "BHQK",
) -> Callable:
    """`with_mask_bias` with the query positions asked for at call time, `positions(q_len)`: a decode step's
    positions come from a cache index that only the call can read and advance."""
    if "bias" not in inspect.signature(attention_fn).parameters:
        raise ConfigError(f"attention_fn {getattr(attention_fn, '__name__', attention_fn)!r} takes no `bias` argument")
    mask_heads(mask_logits, mask_structure)
    check_layout(layout)

    def biased(query, key, value, bias=None, mask=None, **kwargs):
        check_heads(mask_logits, mask_structure, query.shape[-2])
        extra = attention_bias(
            mask_logits,
            query.shape[-3],
            key.shape[-3],
            mask_structure=mask_structure,
            causal=causal,
            mask_scale=mask_scale,
            query_positions=positions(query.shape[-3]),
            layout=layout,
        )
        return attention_fn(query, key, value, bias=extra if bias is None else bias + extra, mask=mask, **kwargs)

    biased.__signature__ = inspect.signature(attention_fn)
    return biased


def with_mask_bias(
    mask_logits: jax.Array,
    *,
    mask_scale: float = 1.0,
    attention_fn: Callable = nn.dot_product_attention,
    query_positions: jax.Array | Sequence[int] | None = None,
    mask_structure: MaskStructure = "full",
    causal: bool = True,
    layout: BiasLayout = "BHQK",
) -> Callable:
    """`attention_fn` with log_sigmoid(mask_scale * mask_logits) added to its `bias`.

    The result has `attention_fn`'s signature, so linen's MultiHeadDotProductAttention passes it the
    same keyword arguments (mask, dropout, module for sown weights) it would pass `attention_fn`.
    q, k, v are [batch..., length, heads, head_dim] (Flax's layout); the bias reaches `attention_fn` as
    [1, heads, q, k] (layout "BHQK", what Flax and jax.nn.dot_product_attention take) or [1, q, heads, k]
    ("BQHK" / "BTNS"). mask_structure, causal: see `attention_bias`.
    """
    return biased_attention_fn(
        mask_logits,
        attention_fn,
        lambda q_len: query_positions,
        mask_scale=mask_scale,
        mask_structure=mask_structure,
        causal=causal,
        layout=layout,
    )


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

    mask_structure: "full" (one logit per head, query and key: [heads, length, length], sequences of
    exactly `length`) or "toeplitz" (one per head and relative distance: any length up to `length`, and
    decoding); causal (toeplitz only): see `attention_bias`.
    decode: the decode steps' query positions come from a `cache_index` in the `cache` collection, which the
    host's decode cache already carries (apply with mutable=["cache"]); `init` sees the whole sequence and
    sets it to 0, each later call advances it by its number of queries. query_positions, when given,
    win over it.
    layout: the bias's layout for `attention_fn` (see `bias_layout`).
    mask_collection: where a fixed mask lives; "params" keeps it in params as `fixed_mask_logits` behind
    jax.lax.stop_gradient, for hosts whose train state keeps params only (see `freeze_fixed_masks`).
    """

    heads: int
    length: int
    mask_mode: MaskMode = "learnable"
    mask_init: MaskInit | jax.Array | np.ndarray | None = None
    mask_scale: float = 1.0
    attention_fn: Callable = nn.dot_product_attention
    mask_structure: MaskStructure = "full"
    causal: bool = True
    decode: bool = False
    layout: BiasLayout = "BHQK"
    mask_collection: MaskCollection = "constants"

    @nn.compact
    def __call__(self, query_positions: jax.Array | Sequence[int] | None = None) -> Callable:
        check_bias_mode("MaskBias", self.mask_mode)
        shape = mask_shape(self.mask_structure, self.heads, self.length, self.causal)
        if self.mask_collection not in ("constants", "params"):
            raise ConfigError(f"unknown mask_collection {self.mask_collection!r}; expected 'constants' or 'params'")
        if self.mask_mode == "fixed" and self.mask_collection == "params":
            init = as_initializer(self.mask_init)
            mask_logits = jax.lax.stop_gradient(self.param(FIXED_MASK_PARAM, init, shape, jnp.float32))
        else:
            mask_logits = linen_mask_logits(self, self.mask_mode, self.mask_init, shape)
        positions = lambda q_len: query_positions  # noqa: E731
        if self.decode and query_positions is None:
            decoding = self.has_variable("cache", "cache_index")
            index = self.variable("cache", "cache_index", lambda: jnp.array(0, jnp.int32))
            if decoding:

                def positions(q_len: int) -> jax.Array:
                    start = index.value
                    index.value = start + q_len
                    return start + jnp.arange(q_len)

        return biased_attention_fn(
            mask_logits,
            self.attention_fn,
            positions,
            mask_scale=self.mask_scale,
            mask_structure=self.mask_structure,
            causal=self.causal,
            layout=self.layout,
        )


MASK_PARAM = "mask_logits"
FIXED_MASK_PARAM = "fixed_mask_logits"


def leaf_name(path: Sequence) -> object:
    """The name of the parameter a tree path leads to: its last dict key or attribute name. In an
    `nnx.State` the path runs through the Variable to its array (`['mask_logits'].value`), so a trailing
    attribute `value` is the Variable's, not the parameter's name (a dict key `value`, as Flax's value
    projection, is a name)."""
    keys = list(path)
    while keys and isinstance(keys[-1], jax.tree_util.GetAttrKey) and keys[-1].name in ("value", "raw_value"):
        keys.pop()
    last = keys[-1] if keys else None
    return getattr(last, "key", getattr(last, "name", None))


def is_mask(path: Sequence, leaf: object = None) -> bool:
    """Whether a parameter-tree path (from `jax.tree_util.tree_flatten_with_path`) ends in a mask, learnable
    (`mask_logits`) or fixed and kept in params (`fixed_mask_logits`)."""
    del leaf
    return leaf_name(path) in (MASK_PARAM, FIXED_MASK_PARAM)


def fixed_masks(params: object) -> object:
    """True for every fixed mask kept in params (`MaskBias(..., mask_mode="fixed", mask_collection="params")`),
    False elsewhere: the tree an optax mask (`optax.masked`, `optax.freeze`) takes."""
    return jax.tree_util.tree_map_with_path(lambda path, leaf: leaf_name(path) == FIXED_MASK_PARAM, params)


def freeze_fixed_masks(optimizer: optax.GradientTransformation) -> optax.GradientTransformation:
    """`optimizer` with every update to a fixed mask kept in params set to zero.

    Why: stop_gradient gives such a mask a zero gradient, so Adam without weight decay leaves it as it is;
    but an optimizer that decays every parameter, or adds anything besides the gradient, would move it.
    Chained after the optimizer, this keeps the mask exactly fixed whatever the optimizer is."""
    return optax.chain(optimizer, optax.masked(optax.set_to_zero(), fixed_masks))


def decay_mask(params: object) -> object:
    """For `optax.adamw(..., mask=maskjax.decay_mask)` (or `optax.add_decayed_weights`): True for every
    parameter except the masks, so weight decay leaves M alone whatever the host decays by default."""
    return jax.tree_util.tree_map_with_path(lambda path, leaf: not is_mask(path), params)


def with_mask_params(pretrained: dict, initialised: dict) -> dict:
    """A masked model's parameters from a pretrained checkpoint of the unmasked model: every parameter from
    `pretrained`, every mask from `initialised` (the masked model's own `init`). Anything else that differs
    (a parameter missing or extra, or of another shape or dtype) is an error that names it, so a checkpoint
    of another model is not silently mixed in."""
    given = dict(jax.tree_util.tree_flatten_with_path(pretrained)[0])
    wanted = dict(jax.tree_util.tree_flatten_with_path(initialised)[0])
    missing = [jax.tree_util.keystr(p) for p in wanted if not is_mask(p) and p not in given]
    extra = [jax.tree_util.keystr(p) for p in given if p not in wanted]
    mismatched = [
        f"{jax.tree_util.keystr(p)} is {describe(given[p])} in the checkpoint, {describe(leaf)} in the model"
        for p, leaf in wanted.items()
        if not is_mask(p) and p in given and describe(given[p]) != describe(leaf)
    ]
    if missing or extra or mismatched:
        parts = [
            f"missing {', '.join(missing)}" if missing else "",
            f"not in the model {', '.join(extra)}" if extra else "",
            "; ".join(mismatched),
        ]
        raise ConfigError("the pretrained parameters do not fit the masked model: " + "; ".join(filter(None, parts)))
    return jax.tree_util.tree_map_with_path(lambda path, leaf: leaf if is_mask(path) else given[path], initialised)


def describe(leaf: object) -> str:
    """A parameter's shape and dtype as an error message names them."""
    dtype = leaf.dtype if hasattr(leaf, "dtype") else np.result_type(leaf)
    return f"{list(np.shape(leaf))} {dtype}"
