"""The token transformer of the GOTU reference code (Abbe et al., ICML 2023), with masked attention.

One token per bit (+-1 mapped to 2 embedding rows), a learned CLS token at position 0,
learned positional embeddings, pre-LayerNorm blocks, GELU MLP, CLS -> LayerNorm -> Linear(1).
Initialisers follow the PyTorch defaults that code relies on (normal embeddings, U(+-1/sqrt(fan_in))
linear layers), so the scale of the logits at init matches the paper's setting.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from maskjax.attention import MaskInit, MaskMode
from maskjax.models.layers import Block, ModelConfig, torch_dense


class GotuTransformer(nn.Module):
    """Maps x in {-1,+1}^[batch, n_bits] to a real prediction [batch].

    Tokens are [CLS, x_0, ..., x_{n-1}], so a mask over them is (n_bits+1) x (n_bits+1) with CLS at 0.
    mask_init broadcasts to [heads, n_bits+1, n_bits+1] and is shared by every layer. qk_norm puts a
    LayerNorm on every block's queries and keys.
    """

    n_bits: int
    config: ModelConfig = ModelConfig()
    mask_mode: MaskMode = "none"
    mask_init: MaskInit | jax.Array | np.ndarray | None = None
    qk_norm: bool = False

    @nn.compact
    def __call__(self, x_BN: jax.Array) -> jax.Array:
        c = self.config
        normal = nn.initializers.normal(1.0)
        tokens = ((x_BN + 1) // 2).astype(jnp.int32)
        h = nn.Embed(2, c.dim, embedding_init=normal, name="token_embed")(tokens)
        cls = self.param("cls", normal, (1, 1, c.dim))
        h = jnp.concatenate([jnp.broadcast_to(cls, (*h.shape[:-2], 1, c.dim)), h], axis=-2)
        h = h + self.param("pos_embed", normal, (self.n_bits + 1, c.dim))
        for layer in range(c.depth):
            h = Block(c, self.mask_mode, self.mask_init, self.qk_norm, name=f"block_{layer}")(h)
        out = nn.LayerNorm(epsilon=1e-5, name="head_norm")(h[..., 0, :])
        return torch_dense(1, c.dim, "head")(out)[..., 0]
