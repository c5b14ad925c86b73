"""The GOTU token transformer and its Adam step in PyTorch eager, the framework of the original GOTU code.

`gotu_model` follows `TokenTransformer` of aryol/GOTU's `token_transformer.py` (commit 8ce173c) module for
module, under its names (PreNorm, Attention, FeedForward, Transformer; `token_embedding`, `pos_embedding`,
`cls_token`, `to_qkv`, `to_out`, `mlp_head`), at the paper's settings: output_dim 1, CLS pooling, no dropout
(p = 0 in every paper run, so the Dropout modules are left out and `to_out` is the Linear itself), and the
prediction squeezed to [batch] (the reference returns [batch, 1] against [batch, 1] targets: the same MSE).
Parameters are created in the reference's order, so torch.manual_seed(s) gives the reference's initial
parameters for seed s, bit for bit.
On top of it, as in maskjax, each layer may add log_sigmoid(M) to its attention logits (`mask_init`).
`load_flax_params` copies a maskjax `GotuTransformer`'s variables into it, so the two compute the same
function (`benchmarks.gotu_crosscheck`, `tests/test_gotu_crosscheck.py`).

Also a peer for `benchmarks.train_step`: the same architecture, initialisation family, optimizer (Adam with
L2 weight decay) and batch as `maskjax.models.gotu`, timed one seed at a time, as that code trains.
Needs the `bench` extra (torch).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from maskjax.errors import ConfigError


def gotu_model(
    n_bits: int,
    dim: int,
    depth: int,
    heads: int,
    head_dim: int,
    mlp_dim: int,
    mask_init: np.ndarray | None = None,
    learnable_mask: bool = True,
) -> Any:
    """The reference TokenTransformer(seq_len=n_bits, output_dim=1, dim, depth, heads, mlp_dim, dim_head=head_dim).

    mask_init, broadcastable to [heads, n_bits+1, n_bits+1] over the tokens [CLS, x_0..]: every layer's
    initial M, as maskjax gives each layer a mask of its own; a parameter when learnable_mask (the optimizer
    and its weight decay reach it), a buffer otherwise. None: plain attention, as in the reference.
    """
    import torch
    from torch import nn

    length = n_bits + 1

    class PreNorm(nn.Module):
        def __init__(self, fn: nn.Module):
            super().__init__()
            self.norm = nn.LayerNorm(dim)
            self.fn = fn

        def forward(self, x):
            return self.fn(self.norm(x))

    class FeedForward(nn.Module):
        def __init__(self):
            super().__init__()
            self.net = nn.Sequential(nn.Linear(dim, mlp_dim), nn.GELU(), nn.Linear(mlp_dim, dim))

        def forward(self, x):
            return self.net(x)

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            inner = heads * head_dim
            self.scale = head_dim**-0.5
            self.to_qkv = nn.Linear(dim, 3 * inner, bias=False)
            # The reference drops the output projection for one head as wide as the model.
            self.to_out = nn.Identity() if heads == 1 and head_dim == dim else nn.Linear(inner, dim)
            if mask_init is not None:
                mask = torch.as_tensor(np.broadcast_to(mask_init, (heads, length, length)).copy(), dtype=torch.float32)
                if learnable_mask:
                    self.mask_logits = nn.Parameter(mask)
                else:
                    self.register_buffer("mask_logits", mask)
            else:
                self.mask_logits = None

        def forward(self, x):
            batch, tokens, _ = x.shape
            # chunk(3) then 'b n (h d) -> b h n d', as the reference's einops rearrange.
            q, k, v = self.to_qkv(x).view(batch, tokens, 3, heads, head_dim).permute(2, 0, 3, 1, 4)
            dots = torch.matmul(q, k.transpose(-1, -2)) * self.scale
            if self.mask_logits is not None:
                dots = dots + nn.functional.logsigmoid(self.mask_logits)
            out = torch.matmul(torch.softmax(dots, dim=-1), v)
            return self.to_out(out.transpose(1, 2).reshape(batch, tokens, heads * head_dim))

    class Transformer(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList(
                [nn.ModuleList([PreNorm(Attention()), PreNorm(FeedForward())]) for _ in range(depth)]
            )

        def forward(self, x):
            for attn, ff in self.layers:
                x = attn(x) + x
                x = ff(x) + x
            return x

    class TokenTransformer(nn.Module):
        def __init__(self):
            super().__init__()
            self.token_embedding = nn.Embedding(2, dim)
            self.pos_embedding = nn.Parameter(torch.randn(1, length, dim))
            self.cls_token = nn.Parameter(torch.randn(1, 1, dim))
            self.transformer = Transformer()
            self.mlp_head = nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, 1))

        def forward(self, inputs):
            x = self.token_embedding(((inputs + 1) / 2).int())
            x = torch.cat([self.cls_token.expand(x.shape[0], 1, dim), x], dim=1) + self.pos_embedding
            return self.mlp_head(self.transformer(x)[:, 0])[:, 0]

    return TokenTransformer()


def torch_state(variables: Mapping[str, Any], depth: int) -> dict[str, np.ndarray]:
    """A maskjax `GotuTransformer`'s variables ({"params": ..., "constants": ...} as `init` returns them) as
    the state dict of `gotu_model`: Flax kernels are [in, out] (DenseGeneral's fused axes flattened), torch
    weights [out, in]. A learnable mask lives in params, a fixed one in constants; both map to
    `mask_logits`. Raises ConfigError for a variable with no torch counterpart (e.g. qk_norm's LayerNorms).
    """
    from flax.traverse_util import flatten_dict

    flat = {
        (collection, *path): np.asarray(value)
        for collection in ("params", "constants")
        for path, value in flatten_dict(dict(variables.get(collection, {}))).items()
    }

    def take(*path: str) -> np.ndarray:
        return flat.pop(("params", *path))

    def linear(prefix: str, *path: str) -> dict[str, np.ndarray]:
        kernel = take(*path, "kernel")
        weights = {f"{prefix}.weight": kernel.reshape(-1, kernel.shape[-1]).T}
        return weights | ({f"{prefix}.bias": take(*path, "bias")} if ("params", *path, "bias") in flat else {})

    def norm(prefix: str, *path: str) -> dict[str, np.ndarray]:
        return {f"{prefix}.weight": take(*path, "scale"), f"{prefix}.bias": take(*path, "bias")}

    state = {
        "token_embedding.weight": take("token_embed", "embedding"),
        "pos_embedding": take("pos_embed")[None],
        "cls_token": take("cls"),
        **norm("mlp_head.0", "head_norm"),
        **linear("mlp_head.1", "head"),
    }
    for i in range(depth):
        block, attn, ff = f"block_{i}", f"transformer.layers.{i}.0", f"transformer.layers.{i}.1"
        qkv = take(block, "attn", "qkv", "kernel")
        state |= {
            **norm(f"{attn}.norm", block, "attn_norm"),
            f"{attn}.fn.to_qkv.weight": qkv.reshape(qkv.shape[0], -1).T,
            **linear(f"{attn}.fn.to_out", block, "attn", "out"),
            **norm(f"{ff}.norm", block, "mlp_norm"),
            **linear(f"{ff}.fn.net.0", block, "mlp_in"),
            **linear(f"{ff}.fn.net.2", block, "mlp_out"),
        }
        for collection in ("params", "constants"):
            if (key := (collection, block, "attn", "mask_logits")) in flat:
                state[f"{attn}.fn.mask_logits"] = flat.pop(key)
    if flat:
        names = ", ".join("/".join(path) for path in flat)
        raise ConfigError(f"maskjax variables with no counterpart in the PyTorch GOTU model: {names}")
    return state


def load_flax_params(model: Any, variables: Mapping[str, Any], depth: int) -> Any:
    """`model` (from `gotu_model`) holding a maskjax `GotuTransformer`'s variables, so the two compute the same
    function; strict, so a mask on one side only, or a model of another shape, is refused. Returns model."""
    import torch

    state = {k: torch.from_numpy(np.array(v)) for k, v in torch_state(variables, depth).items()}
    model.load_state_dict(state, strict=True)
    return model


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
