"""PyTorch eager peers of maskjax's causal LM (language and arithmetic studies) and ViT (vision study).

Peers for `benchmarks.step`: the same model, optimizer and batch as the maskjax study, timed one seed at a
time in eager mode, as a PyTorch user would train it. Models: `maskjax.models.causal.CausalTransformer`
and `maskjax.models.vit.ViT` (GAP, learned positions) without a mask, with the same pre-LayerNorm blocks,
parameter shapes and initialisation family (torch's default Linear init, which maskjax mimics). Steps:
the study's loss, gradient clipping where it clips, AdamW and its warmup + cosine schedule (a LambdaLR
stepped every step, so the optimizer's work matches optax's). Attention is the explicit softmax by
default; `sdpa=True` uses F.scaled_dot_product_attention instead. Needs the `bench` extra (torch); the
module imports without it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import numpy as np

ModelDims = tuple[int, int, int, int, int]  # (dim, depth, heads, head_dim, mlp_dim), as in torch_gotu
# A fixed per-channel normalisation for the random images (the study uses its training split's stats).
IMAGE_MEAN, IMAGE_STD = 0.5, 0.25


def _block(dim: int, heads: int, head_dim: int, mlp_dim: int, sdpa: bool):
    """maskjax.models.layers.Block without a mask: pre-LN attention (fused qkv without bias, out with bias)
    then a GELU MLP, each added to the residual. forward(x, bias, causal): bias is a float logit bias
    [heads, L, L] (ALiBi) or None."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.attn_norm, self.mlp_norm = nn.LayerNorm(dim, eps=1e-5), nn.LayerNorm(dim, eps=1e-5)
            self.qkv = nn.Linear(dim, 3 * heads * head_dim, bias=False)
            self.out = nn.Linear(heads * head_dim, dim)
            self.mlp = nn.Sequential(nn.Linear(dim, mlp_dim), nn.GELU(), nn.Linear(mlp_dim, dim))

        def forward(self, x, bias=None, causal: bool = False):
            batch, length, _ = x.shape
            q, k, v = self.qkv(self.attn_norm(x)).view(batch, length, 3, heads, head_dim).permute(2, 0, 3, 1, 4)
            if sdpa:
                if bias is None:
                    attn = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                else:
                    if causal:
                        future = torch.ones(length, length, dtype=torch.bool, device=x.device).triu(1)
                        bias = bias.masked_fill(future, float("-inf"))
                    attn = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
            else:
                logits = q @ k.transpose(-1, -2) / head_dim**0.5
                if bias is not None:
                    logits = logits + bias
                if causal:
                    future = torch.ones(length, length, dtype=torch.bool, device=x.device).triu(1)
                    logits = logits.masked_fill(future, float("-inf"))
                attn = torch.softmax(logits, dim=-1) @ v
            x = x + self.out(attn.transpose(1, 2).reshape(batch, length, heads * head_dim))
            return x + self.mlp(self.mlp_norm(x))

    return Block()


def causal_lm(
    vocab: int,
    length: int,
    dim: int,
    depth: int,
    heads: int,
    head_dim: int,
    mlp_dim: int,
    alibi: bool = False,
    sdpa: bool = False,
):
    """`CausalTransformer` (mask_mode "none"): int64 tokens [B, L] -> logits [B, L, vocab], L <= length.

    alibi adds ALiBi's fixed bias in every layer (position_bias="alibi"), beside the learned positions."""
    import torch
    from torch import nn

    class CausalLM(nn.Module):
        def __init__(self):
            super().__init__()
            self.token_embed = nn.Embedding(vocab, dim)  # N(0, 1), as maskjax's normal(1.0)
            self.pos_embed = nn.Parameter(torch.randn(length, dim))
            self.blocks = nn.ModuleList([_block(dim, heads, head_dim, mlp_dim, sdpa) for _ in range(depth)])
            self.head_norm = nn.LayerNorm(dim, eps=1e-5)
            self.head = nn.Linear(dim, vocab)
            if alibi:
                slopes = 2.0 ** (-8.0 * torch.arange(1, heads + 1, dtype=torch.float32) / heads)
                distance = (torch.arange(length)[:, None] - torch.arange(length)[None, :]).clamp(min=0)
                self.register_buffer("alibi", -slopes[:, None, None] * distance, persistent=False)
            else:
                self.alibi = None

        def forward(self, tokens):
            n = tokens.shape[-1]
            h = self.token_embed(tokens) + self.pos_embed[:n]
            bias = None if self.alibi is None else self.alibi[:, :n, :n]
            for block in self.blocks:
                h = block(h, bias, causal=True)
            return self.head(self.head_norm(h))

    return CausalLM()


def vit(
    image_size: int,
    channels: int,
    patch_size: int,
    num_classes: int,
    dim: int,
    depth: int,
    heads: int,
    head_dim: int,
    mlp_dim: int,
    sdpa: bool = False,
):
    """`ViT` (pool "gap", posemb "learn", no mask): float images [B, H, W, C] -> logits [B, num_classes].

    The conv stem takes Flax's Conv init (lecun_normal kernel, zero bias); the head starts at zero."""
    import torch
    from torch import nn

    grid = image_size // patch_size

    class ViT(nn.Module):
        def __init__(self):
            super().__init__()
            self.embedding = nn.Conv2d(channels, dim, patch_size, stride=patch_size)
            fan_in = channels * patch_size**2
            std = (1.0 / fan_in) ** 0.5 / 0.87962566103423978  # jax's truncated_normal variance scaling
            nn.init.trunc_normal_(self.embedding.weight, std=std, a=-2 * std, b=2 * std)
            nn.init.zeros_(self.embedding.bias)
            self.pos_embed = nn.Parameter(torch.randn(grid * grid, dim) / dim**0.5)
            self.blocks = nn.ModuleList([_block(dim, heads, head_dim, mlp_dim, sdpa) for _ in range(depth)])
            self.encoder_norm = nn.LayerNorm(dim, eps=1e-6)
            self.head = nn.Linear(dim, num_classes)
            nn.init.zeros_(self.head.weight)
            nn.init.zeros_(self.head.bias)

        def forward(self, images):
            h = self.embedding(images.permute(0, 3, 1, 2)).flatten(2).transpose(1, 2) + self.pos_embed
            for block in self.blocks:
                h = block(h)
            return self.head(self.encoder_norm(h).mean(dim=1))

    return ViT()


def _warmup_cosine(warmup: int, total: int) -> Callable[[int], float]:
    """optax.warmup_cosine_decay_schedule(0, 1, warmup, total) (cosine_decay_schedule without warmup) as a
    LambdaLR factor."""

    def factor(t: int) -> float:
        if t < warmup:
            return t / warmup
        return 0.5 * (1 + math.cos(math.pi * min(t - warmup, total - warmup) / max(1, total - warmup)))

    return factor


def _time(
    model,
    loss_of: Callable,
    steps: int,
    repeats: int,
    learning_rate: float,
    weight_decay: float,
    warmup_fraction: float,
    clip_norm: float | None,
    device: str,
) -> float:
    """Best-of-`repeats` mean seconds per AdamW step (after one untimed pass of `steps` steps);
    loss_of(t) is step t's loss. The schedule spans every step taken."""
    import torch

    optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate, weight_decay=weight_decay)
    total = steps * (repeats + 1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, _warmup_cosine(int(warmup_fraction * total), total))
    sync = torch.cuda.synchronize if torch.device(device).type == "cuda" else (lambda: None)

    def run() -> float:
        sync()
        started = time.perf_counter()
        for t in range(steps):
            optimizer.zero_grad(set_to_none=True)
            loss = loss_of(t)
            loss.backward()
            if clip_norm is not None:
                torch.nn.utils.clip_grad_norm_(model.parameters(), clip_norm)
            optimizer.step()
            scheduler.step()
        sync()
        return (time.perf_counter() - started) / steps

    run()
    return min(run() for _ in range(repeats))


def time_language_steps(
    vocab: int,
    context: int,
    model_dims: ModelDims,
    batch_size: int,
    steps: int,
    repeats: int,
    learning_rate: float = 1e-3,
    weight_decay: float = 0.1,
    clip_norm: float | None = 1.0,
    sdpa: bool = False,
    seed: int = 0,
    device: str = "cpu",
) -> float:
    """Seconds per step of the language study's loss (mean next-token NLL of random windows), clipping,
    AdamW and 5% warmup + cosine, one seed: the best of `repeats` means over `steps` steps."""
    import torch
    import torch.nn.functional as F

    torch.manual_seed(seed)
    model = causal_lm(vocab, context, *model_dims, sdpa=sdpa).to(device)
    windows = np.random.default_rng(seed).integers(0, vocab, (steps, batch_size, context + 1))
    windows = torch.as_tensor(windows, dtype=torch.int64, device=device)
    inputs, targets = windows[:, :, :-1], windows[:, :, 1:]

    def loss_of(t: int):
        return F.cross_entropy(model(inputs[t]).reshape(-1, vocab), targets[t].reshape(-1))

    return _time(model, loss_of, steps, repeats, learning_rate, weight_decay, 0.05, clip_norm, device)


def time_arithmetic_steps(
    vocab: int,
    length: int,
    prompt: int,
    model_dims: ModelDims,
    batch_size: int,
    steps: int,
    repeats: int,
    learning_rate: float = 1e-3,
    weight_decay: float = 1e-3,
    sdpa: bool = False,
    seed: int = 0,
    device: str = "cpu",
) -> float:
    """Seconds per step of the arithmetic study's `answer_loss` (logits[:, prompt-1:-1] predict
    tokens[:, prompt:]) on random sequences, AdamW and cosine decay, no clipping, one seed."""
    import torch
    import torch.nn.functional as F

    torch.manual_seed(seed)
    model = causal_lm(vocab, length, *model_dims, sdpa=sdpa).to(device)
    tokens = np.random.default_rng(seed).integers(0, vocab, (steps, batch_size, length))
    tokens = torch.as_tensor(tokens, dtype=torch.int64, device=device)

    def loss_of(t: int):
        predicted = model(tokens[t])[:, prompt - 1 : -1]
        return F.cross_entropy(predicted.reshape(-1, vocab), tokens[t, :, prompt:].reshape(-1))

    return _time(model, loss_of, steps, repeats, learning_rate, weight_decay, 0.0, None, device)


def augment(images, pad: int, flip: bool):
    """`maskjax.tasks.vision.augment` in torch: [B, H, W, C] zero-padded by `pad`, cropped back at a random
    offset per image, and (with flip) each image flipped left-right with probability 1/2; one gather."""
    import torch

    batch, height, width, _ = images.shape
    device = images.device
    rows = torch.arange(height, device=device).expand(batch, height)
    cols = torch.arange(width, device=device).expand(batch, width)
    if pad:
        images = torch.nn.functional.pad(images, (0, 0, pad, pad, pad, pad))
        offsets = torch.randint(0, 2 * pad + 1, (batch, 2), device=device)
        rows, cols = rows + offsets[:, :1], cols + offsets[:, 1:]
    if flip:
        flipped = torch.rand(batch, 1, device=device) < 0.5
        cols = torch.where(flipped, cols.flip(-1), cols)
    if not pad and not flip:
        return images
    index = torch.arange(batch, device=device)[:, None, None]
    return images[index, rows[:, :, None], cols[:, None, :]]


def time_vision_steps(
    image_shape: tuple[int, int, int],
    num_classes: int,
    patch_size: int,
    model_dims: ModelDims,
    batch_size: int,
    steps: int,
    repeats: int,
    crop_pad: int,
    flip: bool,
    learning_rate: float = 1e-3,
    weight_decay: float = 0.01,
    clip_norm: float | None = 1.0,
    sdpa: bool = False,
    seed: int = 0,
    device: str = "cpu",
) -> float:
    """Seconds per step of the vision study on random uint8 images [H, W, C]: augment (pad + crop, flips),
    normalise, softmax cross-entropy of the ViT's logits, clipping, AdamW and 5% warmup + cosine, one seed."""
    import torch
    import torch.nn.functional as F

    height, width, channels = image_shape
    if height != width:
        raise ValueError(f"square images only, got {height} x {width}")
    torch.manual_seed(seed)
    model = vit(height, channels, patch_size, num_classes, *model_dims, sdpa=sdpa).to(device)
    rng = np.random.default_rng(seed)
    images = torch.as_tensor(rng.integers(0, 256, (steps, batch_size, *image_shape), dtype=np.uint8), device=device)
    labels = torch.as_tensor(rng.integers(0, num_classes, (steps, batch_size)), dtype=torch.int64, device=device)

    def loss_of(t: int):
        x = (augment(images[t], crop_pad, flip).float() / 255.0 - IMAGE_MEAN) / IMAGE_STD
        return F.cross_entropy(model(x), labels[t])

    return _time(model, loss_of, steps, repeats, learning_rate, weight_decay, 0.05, clip_norm, device)
