"""The GOTU token transformer and its Adam step in PyTorch eager, the framework of the original GOTU code.

A peer for `benchmarks.train_step`: the same architecture, initialisation family, optimizer (Adam with
L2 weight decay) and batch as `maskjax.models.gotu`, timed one seed at a time, as that code trains.
Needs the `bench` extra (torch).
"""

from __future__ import annotations

import time

import numpy as np


def gotu_model(n_bits: int, dim: int, depth: int, heads: int, head_dim: int, mlp_dim: int):
    import torch
    from torch import nn

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.attn_norm, self.mlp_norm = nn.LayerNorm(dim), nn.LayerNorm(dim)
            self.qkv = nn.Linear(dim, 3 * heads * head_dim, bias=False)
            self.out = nn.Linear(heads * head_dim, dim)
            self.mlp = nn.Sequential(nn.Linear(dim, mlp_dim), nn.GELU(), nn.Linear(mlp_dim, dim))

        def forward(self, x):
            batch, length, _ = x.shape
            q, k, v = self.qkv(self.attn_norm(x)).view(batch, length, 3, heads, head_dim).permute(2, 0, 3, 1, 4)
            attn = torch.softmax(q @ k.transpose(-1, -2) / head_dim**0.5, dim=-1) @ v
            x = x + self.out(attn.transpose(1, 2).reshape(batch, length, heads * head_dim))
            return x + self.mlp(self.mlp_norm(x))

    class Gotu(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(2, dim)
            self.cls = nn.Parameter(torch.randn(1, 1, dim))
            self.pos = nn.Parameter(torch.randn(n_bits + 1, dim))
            self.blocks = nn.Sequential(*[Block() for _ in range(depth)])
            self.head = nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, 1))

        def forward(self, x):
            h = self.embed(((x + 1) // 2).long())
            h = torch.cat([self.cls.expand(x.shape[0], 1, dim), h], dim=1) + self.pos
            return self.head(self.blocks(h)[:, 0])[:, 0]

    return Gotu()


def time_steps(
    n_bits: int,
    model_dims: tuple[int, int, int, int, int],
    batch_size: int,
    steps: int,
    repeats: int,
    learning_rate: float = 1e-5,
    seed: int = 0,
) -> float:
    """Best-of-`repeats` seconds per Adam step of one seed, each measured over `steps` steps."""
    import torch

    torch.manual_seed(seed)
    model = gotu_model(n_bits, *model_dims)
    optimizer = torch.optim.Adam(model.parameters(), lr=learning_rate, weight_decay=1e-3)
    rng = np.random.default_rng(seed)
    x = torch.as_tensor(rng.choice([-1.0, 1.0], size=(steps, batch_size, n_bits)), dtype=torch.float32)
    y = x[..., 0] * x[..., 1]

    def run() -> float:
        started = time.perf_counter()
        for t in range(steps):
            optimizer.zero_grad(set_to_none=True)
            loss = torch.mean((model(x[t]) - y[t]) ** 2)
            loss.backward()
            optimizer.step()
        return (time.perf_counter() - started) / steps

    run()
    return min(run() for _ in range(repeats))


def version() -> str | None:
    """torch's version, or None when the `bench` extra is not installed."""
    try:
        import torch
    except ImportError:
        return None
    return torch.__version__
