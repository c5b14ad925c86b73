"""Layers every maskjax model shares: the width / depth config, a torch-initialised Dense and the
pre-LayerNorm block with masked attention."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn
from flax.linen.dtypes import promote_dtype

from maskjax.attention import (
    ATTENTION_IMPLS,
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
    attention_impl: str = option(
        "auto",
        choices=ATTENTION_IMPLS,
        help="attention path: auto (manual on CPU, fused elsewhere), einsum, fused, or manual (a written backward)",
    )


def torch_dense(features: int, fan_in: int, name: str, dtype: str = "float32") -> nn.Dense:
    return nn.Dense(features, dtype=dtype, kernel_init=torch_linear_init, bias_init=torch_bias_init(fan_in), name=name)


@jax.custom_vjp
def readout(h_ND: jax.Array, kernel_DV: jax.Array) -> jax.Array:
    """h @ kernel over the last axis of h, whose kernel gradient contracts the tokens with h as the left
    operand. Autodiff writes it as (dlogits^T h)^T, and XLA's CPU backend then transposes the logits'
    gradient, a [tokens, vocab] array (23.7 ms of the quick language step), where h^T costs a [tokens, dim]
    one (issue 48)."""
    return jnp.einsum("...d,dv->...v", h_ND, kernel_DV)


def _readout_forward(h_ND: jax.Array, kernel_DV: jax.Array) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
    return readout(h_ND, kernel_DV), (h_ND, kernel_DV)


def _readout_backward(saved: tuple[jax.Array, jax.Array], grad_NV: jax.Array) -> tuple[jax.Array, jax.Array]:
    h_ND, kernel_DV = saved
    tokens_TD = h_ND.reshape(-1, h_ND.shape[-1])
    grad_TV = grad_NV.reshape(-1, grad_NV.shape[-1])
    grad_kernel = jax.lax.dot_general(tokens_TD, grad_TV, (((0,), (0,)), ((), ())))
    grad_h = jnp.einsum("...v,dv->...d", grad_NV, kernel_DV)
    return grad_h.astype(h_ND.dtype), grad_kernel.astype(kernel_DV.dtype)


readout.defvjp(_readout_forward, _readout_backward)


class Readout(nn.Module):
    """`torch_dense`'s parameters, initial values and outputs, with `readout`'s kernel gradient: the vocabulary
    head of the causal models."""

    features: int
    fan_in: int
    dtype: str = "float32"

    @nn.compact
    def __call__(self, h: jax.Array) -> jax.Array:
        kernel = self.param("kernel", torch_linear_init, (h.shape[-1], self.features), jnp.float32)
        bias = self.param("bias", torch_bias_init(self.fan_in), (self.features,), jnp.float32)
        h, kernel, bias = promote_dtype(h, kernel, bias, dtype=self.dtype)
        return readout(h, kernel) + bias


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
            attention_impl=c.attention_impl,
            name="attn",
        )(h, bias)
        h = nn.LayerNorm(epsilon=1e-5, name="mlp_norm")(x_BLD)
        h = torch_dense(c.mlp_dim, c.dim, "mlp_in", c.dtype)(h)
        h = nn.gelu(h, approximate=False)
        return x_BLD + torch_dense(c.dim, c.mlp_dim, "mlp_out", c.dtype)(h).astype(x_BLD.dtype)
