"""A small causal (GPT-style) token transformer with masked attention, for the arithmetic study.

Token embedding, learned positions, the GOTU model's pre-LayerNorm blocks with a hard causal mask
(the learnable prior is added on top of it), a final LayerNorm and a linear read-out to the vocabulary.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from maskjax.attention import MaskInit, MaskMode
from maskjax.models.layers import Block, ModelConfig, torch_dense


class CausalTransformer(nn.Module):
    """Maps tokens [batch, length] to next-token logits [batch, length, vocab].

    mask_init broadcasts to [heads, length, length] and is shared by every layer.
    """

    vocab: int
    length: int
    config: ModelConfig = ModelConfig()
    mask_mode: MaskMode = "none"
    mask_init: MaskInit | jax.Array | np.ndarray | None = None
    qk_norm: bool = False

    @nn.compact
    def __call__(self, tokens_BL: jax.Array) -> jax.Array:
        c = self.config
        normal = nn.initializers.normal(1.0)
        h = nn.Embed(self.vocab, c.dim, embedding_init=normal, name="token_embed")(tokens_BL)
        h = h + self.param("pos_embed", normal, (self.length, c.dim))[: tokens_BL.shape[-1]]
        for layer in range(c.depth):
            h = Block(c, self.mask_mode, self.mask_init, self.qk_norm, causal=True, name=f"block_{layer}")(h)
        h = nn.LayerNorm(epsilon=1e-5, name="head_norm")(h)
        return torch_dense(self.vocab, c.dim, "head", c.dtype)(h).astype(jnp.float32)
