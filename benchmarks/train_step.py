"""Train-step speed of the Boolean study: python -m benchmarks.train_step [--preset=quick|paper] [--seeds=1,2,4,8]

`python -m benchmarks.step --study=boolean` times the same step beside the other studies; this one adds
the Boolean sweeps over depth and input bits. For each number of seeds S, the whole batch of S runs
trains as one vmapped, jitted program (the study's own `compile_program`). Printed per S: seconds per
step, seed-steps per second batched and its ratio to S seeds run one after another, achieved FLOP/s
(FLOPs from XLA's cost analysis of the compiled step) as a fraction of an fp32 matmul peak measured in
the same process, and XLA's memory estimate. With --depths or --bits the same is measured for one S
across model depths or input bits. With torch installed (the `bench` extra), the PyTorch eager peer is
timed on the same steps. Prints tables, then one JSON line. Measures, never asserts.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

from benchmarks import step, torch_gotu
from benchmarks.step import int_list
from maskjax import store
from maskjax.cli.driver import Parser, positive_int, run_main
from maskjax.methods import get_method
from maskjax.studies import boolean as study
from maskjax.tasks.boolean import get_task, two_parity


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = Parser(prog="python -m benchmarks.train_step", description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="quick", help="a Boolean preset, e.g. paper, w64d4, quick (default quick)")
    p.add_argument("--seeds", type=int_list, default=[1, 2, 4, 8], help="batch sizes in runs (default 1,2,4,8)")
    p.add_argument("--method", default="vanilla", help="method whose step is timed (default vanilla)")
    p.add_argument("--steps", type=positive_int, help="steps per timed chunk (default: 50 quick, 3 paper)")
    p.add_argument("--repeats", type=positive_int, default=3, help="timed chunks; the best is kept (default 3)")
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32", help="matmul dtype")
    p.add_argument("--depths", type=int_list, help="also time these depths at the largest --seeds")
    p.add_argument("--bits", type=int_list, help="also time 2Parity on these numbers of bits (>= 10)")
    p.add_argument("--no-torch", action="store_true", help="skip the PyTorch eager peer")
    return p.parse_args(argv)


def time_batch(config: study.BooleanConfig, task, method, seeds: int, steps: int, repeats: int) -> dict:
    """Seconds per step of `seeds` runs of (task, method) trained as one batch, with XLA's FLOP and memory counts."""
    built = study.make_group(study.BooleanGroup(task, method), list(range(seeds)), config)
    return step.time_batch(built.inputs, steps, repeats)


def table(rows: list[dict], first: str, peak: float) -> str:
    lines = [
        f"| {first} | s/step | seed-steps/s | vs sequential | GFLOP/step | GFLOP/s | of peak | XLA MiB |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r[first]} | {r['step_seconds']:.4g} | {r['seed_steps_per_s']:.1f} | {versus(r)} "
            f"| {r['flops_per_step'] / 1e9:.3f} | {r['flops_per_s'] / 1e9:.1f} | {r['flops_per_s'] / peak:.0%} "
            f"| {(r['xla_memory_bytes'] or 0) / 2**20:.0f} |"
        )
    return "\n".join(lines)


def versus(row: dict) -> str:
    return f"{row['vs_sequential']:.2f}x" if "vs_sequential" in row else "-"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    base = study.STUDY.preset(args.preset)
    config = dataclasses.replace(base, model=dataclasses.replace(base.model, dtype=args.dtype))
    task, method = get_task("2parity"), get_method(args.method)
    steps = args.steps or (3 if args.preset == "paper" else 50)
    env = store.environment()
    print(f"devices: {env['devices']}  jax {env['jax_version']}  commit {env['git_commit']}", file=sys.stderr)
    peak = step.matmul_peak()
    print(f"fp32 matmul peak: {peak / 1e9:.1f} GFLOP/s", file=sys.stderr)
    m = config.model
    print(
        f"preset {args.preset}: dim {m.dim}, depth {m.depth}, heads {m.heads}x{m.head_dim}, mlp {m.mlp_dim}, "
        f"batch {config.batch_size}, {task.n_bits} bits, {args.method}, {args.dtype}; {steps} steps x {args.repeats}",
        file=sys.stderr,
    )
    rows = []
    for seeds in args.seeds:
        rows.append(time_batch(config, task, method, seeds, steps, args.repeats))
        print(f"  {seeds} seeds: {rows[-1]['step_seconds']:.4g} s/step", file=sys.stderr)
    single = next((r for r in rows if r["seeds"] == 1), None)
    for r in rows:
        if single is not None:
            r["vs_sequential"] = r["seed_steps_per_s"] / single["seed_steps_per_s"]
    print(f"\n## Seeds per batch ({args.preset})\n\n" + table(rows, "seeds", peak))
    result = {"preset": args.preset, "dtype": args.dtype, "matmul_peak_flops": peak, "seeds": rows, **env}
    widest = max(args.seeds)
    if args.depths:
        depth_rows = []
        for depth in args.depths:
            deep = dataclasses.replace(config, model=dataclasses.replace(config.model, depth=depth))
            depth_rows.append({"depth": depth, **time_batch(deep, task, method, widest, steps, 2)})
        print(f"\n## Depth ({widest} seeds)\n\n" + table(depth_rows, "depth", peak))
        result["depths"] = depth_rows
    if args.bits:
        bit_rows = []
        for bits in args.bits:
            wide = dataclasses.replace(config, schedules={**config.schedules, f"2parity{bits}": (1e-5, 1)})
            row = time_batch(wide, two_parity(bits, f"2parity{bits}"), method, widest, steps, 2)
            bit_rows.append({"bits": bits, **row})
        print(f"\n## Input bits ({widest} seeds)\n\n" + table(bit_rows, "bits", peak))
        result["bits"] = bit_rows
    if not args.no_torch and torch_gotu.version() is not None:
        dims = (m.dim, m.depth, m.heads, m.head_dim, m.mlp_dim)
        torch_seconds = torch_gotu.time_steps(task.n_bits, dims, config.batch_size, steps, args.repeats)
        best_batched = max(r["seed_steps_per_s"] for r in rows)
        result["torch"] = {
            "version": torch_gotu.version(),
            "step_seconds": torch_seconds,
            "one_seed_speedup": torch_seconds / single["step_seconds"] if single else None,
            "batched_speedup": best_batched * torch_seconds,
        }
        print(
            f"\n## PyTorch eager peer (torch {torch_gotu.version()}, one seed at a time)\n\n"
            f"torch {torch_seconds:.4g} s/step; maskjax one seed "
            + (f"{result['torch']['one_seed_speedup']:.2f}x faster" if single else "not timed")
            + f"; maskjax best batch {result['torch']['batched_speedup']:.2f}x torch's seed-steps/s"
        )
    result["peak_memory_bytes"] = step.peak_memory_bytes()
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
