"""Einsum, fused and manual attention: python -m benchmarks.attention_impl [--lengths=64,256,1024]

Times forward + backward of `MaskedSelfAttention` with a learnable mask on each path
(`attention_impl="einsum"`, the explicit softmax the probes read; `"fused"`, jax.nn.dot_product_attention
with the mask as its bias; `"manual"`, `vjp_attention`'s hand-written backward, issue 48) and prints
seconds per call and each path's ratio to einsum (above 1: faster than einsum). On CPU XLA runs all as
plain HLO; GPUs may fuse. Measures, never asserts.
"""

from __future__ import annotations

import sys
import time

import jax
import jax.numpy as jnp

from benchmarks.step import int_list
from maskjax.attention import MaskedSelfAttention
from maskjax.cli.driver import Parser, positive_int, run_main


def seconds_per_call(fn, *args, repeats: int) -> float:
    jax.block_until_ready(fn(*args))
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        jax.block_until_ready(fn(*args))
        best = min(best, time.perf_counter() - started)
    return best


def main(argv: list[str] | None = None) -> int:
    p = Parser(prog="python -m benchmarks.attention_impl", description=__doc__.splitlines()[0])
    p.add_argument("--lengths", type=int_list, default=[64, 256, 1024], help="sequence lengths (default 64,256,1024)")
    p.add_argument("--batch", type=positive_int, default=8)
    p.add_argument("--heads", type=positive_int, default=8)
    p.add_argument("--head-dim", type=positive_int, default=64)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--repeats", type=positive_int, default=5, help="timed calls; the best is kept (default 5)")
    args = p.parse_args(argv)
    dtype = jnp.dtype(args.dtype)
    print(f"{jax.devices()}, batch {args.batch}, {args.heads} heads of {args.head_dim}, {args.dtype}")
    print("| length | einsum s | fused s | manual s | einsum / fused | einsum / manual |")
    print("|---|---|---|---|---|---|")
    for length in args.lengths:
        x = jax.random.normal(jax.random.key(0), (args.batch, length, args.heads * args.head_dim), dtype)
        times = {}
        for impl in ("einsum", "fused", "manual"):
            layer = MaskedSelfAttention(args.heads, args.head_dim, mask_mode="learnable", dtype=dtype,
                                        attention_impl=impl)
            params = layer.init(jax.random.key(1), x)["params"]
            step = jax.jit(jax.value_and_grad(lambda p, x, layer=layer: jnp.sum(layer.apply({"params": p}, x) ** 2)))
            times[impl] = seconds_per_call(step, params, x, repeats=args.repeats)
        cells = " | ".join(f"{times[impl]:.4g}" for impl in ("einsum", "fused", "manual"))
        ratios = " | ".join(f"{times['einsum'] / times[impl]:.2f}" for impl in ("fused", "manual"))
        print(f"| {length} | {cells} | {ratios} |")
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
