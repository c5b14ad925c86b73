"""Layers every maskjax model shares: the width / depth config, a torch-initialised Dense and the
pre-LayerNorm block with masked attention."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
from flax import linen as nn

from maskjax.attention import (
    MaskedSelfAttention,
    MaskInit,
    MaskMode,
    MaskStructure,
    torch_bias_init,
    torch_linear_init,
)
from maskjax.overrides import option


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    dim: int = option(256, help="model width")
    depth: int = option(12, help="number of blocks")
    heads: int = option(6, help="attention heads")
    head_dim: int = option(64, help="width of each head")
    mlp_dim: int = option(256, help="MLP hidden width")
    dtype: str = option(
        "float32",
        choices=("float32", "bfloat16"),
        help="matmul dtype (bfloat16 for accelerators; parameters, LayerNorm, softmax and optimizer stay float32)",
    )


def torch_dense(features: int, fan_in: int, name: str, dtype: str = "float32") -> nn.Dense:
    return nn.Dense(features, dtype=dtype, kernel_init=torch_linear_init, bias_init=torch_bias_init(fan_in), name=name)


class Block(nn.Module):
    """Pre-LayerNorm block: masked self-attention, then a GELU MLP, each added to the residual stream.

    bias: a fixed logit bias for the attention (see `MaskedSelfAttention`)."""

    config: ModelConfig
    mask_mode: MaskMode
    mask_init: MaskInit | jax.Array | np.ndarray | None
    qk_norm: bool = False
    causal: bool = False
    mask_scale: float = 1.0
    mask_structure: MaskStructure = "full"

    @nn.compact
    def __call__(self, x_BLD: jax.Array, bias: jax.Array | None = None) -> jax.Array:
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
            mask_scale=self.mask_scale,
            mask_structure=self.mask_structure,
            name="attn",
        )(h, bias)
        h = nn.LayerNorm(epsilon=1e-5, name="mlp_norm")(x_BLD)
        h = torch_dense(c.mlp_dim, c.dim, "mlp_in", c.dtype)(h)
        h = nn.gelu(h, approximate=False)
        return x_BLD + torch_dense(c.dim, c.mlp_dim, "mlp_out", c.dtype)(h).astype(x_BLD.dtype)
