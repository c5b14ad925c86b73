"""A Vision Transformer in the style of big_vision's models/vit.py, with the project's masked attention.

Conv patch stem, learned (or fixed sincos2d) position embeddings, the shared pre-LayerNorm blocks
(maskjax.models.layers.Block), a final LayerNorm, global average pooling (or a CLS token) and a
zero-initialised linear head. The learned positions are a parameter named `pos_embed` [tokens, width],
where the QK priors (maskjax.qk_priors) look for them.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from maskjax.attention import MaskInit, MaskMode
from maskjax.errors import ConfigError
from maskjax.models.layers import Block, ModelConfig

POOLS = ("gap", "cls")
POSEMBS = ("learn", "sincos2d")


def sincos2d(grid: int, width: int, temperature: float = 10_000.0) -> np.ndarray:
    """Fixed 2D sine-cosine position embeddings [grid * grid, width] (MoCo v3, big_vision)."""
    if width % 4:
        raise ConfigError(f"sincos2d needs a width divisible by 4, got {width}")
    y, x = np.mgrid[:grid, :grid]
    omega = 1.0 / temperature ** (np.arange(width // 4) / (width // 4 - 1 or 1))
    y = y.reshape(-1, 1) * omega[None]
    x = x.reshape(-1, 1) * omega[None]
    return np.concatenate([np.sin(x), np.cos(x), np.sin(y), np.cos(y)], axis=1).astype(np.float32)


class PatchEmbed(nn.Module):
    """The patch stem: a p x p convolution with stride p, as `nn.Conv` stores it (`kernel` [p, p, C, width],
    `bias`), computed as one matmul over the flattened patches. Under `vmap` over runs a convolution
    becomes a grouped one, whose weight gradient XLA's CPU backend computes 40 times slower at 8 runs
    than at one (docs/performance.md); a matmul batches like every other dense layer."""

    features: int
    patch_size: int
    dtype: str = "float32"

    @nn.compact
    def __call__(self, images_BHWC: jax.Array) -> jax.Array:
        p, channels = self.patch_size, images_BHWC.shape[-1]
        kernel = self.param("kernel", nn.initializers.lecun_normal(), (p, p, channels, self.features))
        bias = self.param("bias", nn.initializers.zeros, (self.features,))
        batch, height, width = images_BHWC.shape[:3]
        patches = images_BHWC.reshape(batch, height // p, p, width // p, p, channels).transpose(0, 1, 3, 2, 4, 5)
        patches_BNK = patches.reshape(batch, -1, p * p * channels).astype(self.dtype)
        flat = kernel.reshape(-1, self.features).astype(self.dtype)
        return patches_BNK @ flat + bias.astype(self.dtype)


class ViT(nn.Module):
    """Maps images [batch, size, size, channels] to class logits [batch, num_classes].

    Tokens are the (size / patch)^2 patches in row-major order, preceded by a CLS token when pool is
    "cls"; a mask over them is tokens x tokens. mask_init broadcasts to [heads, tokens, tokens] and is
    shared by every layer.
    """

    num_classes: int
    image_size: int
    patch_size: int
    config: ModelConfig = ModelConfig(dim=192, depth=12, heads=3, head_dim=64, mlp_dim=768)
    mask_mode: MaskMode = "none"
    mask_init: MaskInit | jax.Array | np.ndarray | None = None
    qk_norm: bool = False
    pool: str = "gap"
    posemb: str = "learn"

    @property
    def grid(self) -> int:
        return self.image_size // self.patch_size

    @property
    def tokens(self) -> int:
        return self.grid**2 + (self.pool == "cls")

    @nn.compact
    def __call__(self, images_BHWC: jax.Array) -> jax.Array:
        c = self.config
        if self.image_size % self.patch_size:
            raise ConfigError(f"patch size {self.patch_size} does not divide image size {self.image_size}")
        if self.pool not in POOLS or self.posemb not in POSEMBS:
            raise ConfigError(f"pool must be one of {POOLS} and posemb one of {POSEMBS}")
        h = PatchEmbed(c.dim, self.patch_size, c.dtype, name="embedding")(images_BHWC).astype(jnp.float32)
        if self.pool == "cls":
            cls = self.param("cls", nn.initializers.zeros, (1, 1, c.dim))
            h = jnp.concatenate([jnp.broadcast_to(cls, (h.shape[0], 1, c.dim)), h], axis=1)
        if self.posemb == "learn":
            h = h + self.param("pos_embed", nn.initializers.normal(1.0 / np.sqrt(c.dim)), (self.tokens, c.dim))
        else:
            fixed = sincos2d(self.grid, c.dim)
            h = h + jnp.asarray(
                np.concatenate([np.zeros((1, c.dim), np.float32), fixed]) if self.pool == "cls" else fixed
            )
        for layer in range(c.depth):
            h = Block(c, self.mask_mode, self.mask_init, self.qk_norm, name=f"block_{layer}")(h)
        h = nn.LayerNorm(epsilon=1e-6, name="encoder_norm")(h)
        pooled = h[:, 0] if self.pool == "cls" else h.mean(axis=1)
        return nn.Dense(self.num_classes, kernel_init=nn.initializers.zeros, name="head")(pooled)
