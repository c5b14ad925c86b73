"""A small causal (GPT-style) token transformer with masked attention, for the arithmetic and language studies.

Token embedding, learned positions, the GOTU model's pre-LayerNorm blocks with a hard causal mask
(the learnable prior is added on top of it), a final LayerNorm and a linear read-out to the vocabulary.
"""

from __future__ import annotations

from typing import Literal

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from maskjax.attention import (
    MaskInit,
    MaskMode,
    MaskStructure,
    alibi_bias,
    expand_mask,
    linen_mask_logits,
    mask_bias,
    mask_shape,
)
from maskjax.models.layers import Block, ModelConfig, Readout

PositionBias = Literal["none", "alibi"]


class CausalTransformer(nn.Module):
    """Maps tokens [batch, length] to next-token logits [batch, length, vocab].

    mask_init broadcasts to the mask's stored shape ([heads, length, length], or [heads, length] for a
    Toeplitz mask) and starts every layer's mask. share_mask: one mask for all layers, the parameter
    `shared_mask/mask_logits`, applied as each block's fixed bias (its gradient sums over the layers).
    position_bias "alibi" adds ALiBi's fixed bias in every layer, beside the learned positions, with the
    paper's slopes, or with `alibi_slopes` (one per head) when given.
    """

    vocab: int
    length: int
    config: ModelConfig = ModelConfig()
    mask_mode: MaskMode = "none"
    mask_init: MaskInit | jax.Array | np.ndarray | None = None
    qk_norm: bool = False
    mask_scale: float = 1.0
    mask_structure: MaskStructure = "full"
    share_mask: bool = False
    position_bias: PositionBias = "none"
    alibi_slopes: tuple[float, ...] | None = None

    @nn.compact
    def __call__(self, tokens_BL: jax.Array) -> jax.Array:
        c = self.config
        length = tokens_BL.shape[-1]
        normal = nn.initializers.normal(1.0)
        h = nn.Embed(self.vocab, c.dim, embedding_init=normal, name="token_embed")(tokens_BL)
        h = h + self.param("pos_embed", normal, (self.length, c.dim))[:length]
        bias = jnp.asarray(alibi_bias(c.heads, length, self.alibi_slopes)) if self.position_bias == "alibi" else None
        block_mask_mode = self.mask_mode
        if self.share_mask and self.mask_mode != "none":
            shared = SharedMask(c.heads, self.mask_mode, self.mask_init, self.mask_structure, name="shared_mask")
            masked = mask_bias(shared(length), self.mask_scale)
            bias, block_mask_mode = masked if bias is None else bias + masked, "none"
        for layer in range(c.depth):
            h = Block(
                c,
                block_mask_mode,
                self.mask_init,
                self.qk_norm,
                causal=True,
                mask_scale=self.mask_scale,
                mask_structure=self.mask_structure,
                name=f"block_{layer}",
            )(h, bias)
        h = nn.LayerNorm(epsilon=1e-5, name="head_norm")(h)
        return Readout(self.vocab, c.dim, c.dtype, name="head")(h).astype(jnp.float32)


class SharedMask(nn.Module):
    """One mask for every layer: `mask_logits` in params (learnable) or constants (fixed), as [heads, N, N]."""

    heads: int
    mask_mode: MaskMode
    mask_init: MaskInit | jax.Array | np.ndarray | None
    mask_structure: MaskStructure

    @nn.compact
    def __call__(self, length: int) -> jax.Array:
        shape = mask_shape(self.mask_structure, self.heads, length)
        return expand_mask(linen_mask_logits(self, self.mask_mode, self.mask_init, shape), length)
