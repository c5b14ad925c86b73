"""The token transformer of the GOTU reference code (Abbe et al., ICML 2023), with masked attention.

One token per bit (+-1 mapped to 2 embedding rows), a learned CLS token at position 0,
learned positional embeddings, pre-LayerNorm blocks, GELU MLP, CLS -> LayerNorm -> Linear(1).
Initialisers follow the PyTorch defaults that code relies on (normal embeddings, U(+-1/sqrt(fan_in))
linear layers), so the scale of the logits at init matches the paper's setting.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from maskjax.attention import MaskedSelfAttention, MaskInit, MaskMode, torch_bias_init, torch_linear_init


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    dim: int = 256
    depth: int = 12
    heads: int = 6
    head_dim: int = 64
    mlp_dim: int = 256
    dtype: str = "float32"  # of the matmuls; parameters, LayerNorm, softmax and the optimizer stay float32


def _torch_dense(features: int, fan_in: int, name: str, dtype: str = "float32") -> nn.Dense:
    return nn.Dense(features, dtype=dtype, kernel_init=torch_linear_init, bias_init=torch_bias_init(fan_in), name=name)


class Block(nn.Module):
    """Pre-LayerNorm block: masked self-attention, then a GELU MLP, each added to the residual stream."""

    config: ModelConfig
    mask_mode: MaskMode
    mask_init: MaskInit | jax.Array | np.ndarray | None
    qk_norm: bool = False
    causal: bool = False

    @nn.compact
    def __call__(self, x_BLD: jax.Array) -> jax.Array:
        c = self.config
        h = nn.LayerNorm(epsilon=1e-5, name="attn_norm")(x_BLD)
        x_BLD = x_BLD + MaskedSelfAttention(
            c.heads,
            c.head_dim,
            mask_mode=self.mask_mode,
            mask_init=self.mask_init,
            dtype=c.dtype,
            qk_norm=self.qk_norm,
            causal=self.causal,
            name="attn",
        )(h)
        h = nn.LayerNorm(epsilon=1e-5, name="mlp_norm")(x_BLD)
        h = _torch_dense(c.mlp_dim, c.dim, "mlp_in", c.dtype)(h)
        h = nn.gelu(h, approximate=False)
        return x_BLD + _torch_dense(c.dim, c.mlp_dim, "mlp_out", c.dtype)(h).astype(x_BLD.dtype)


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
        return _torch_dense(1, c.dim, "head")(out)[..., 0]
