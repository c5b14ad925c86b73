"""One training step of any registered study, timed: python -m benchmarks.step --study=boolean

For each number of seeds S the batch of S runs is the study's own program (its `build`, then
`maskjax.train.compile_program`: `vmap` over runs, `lax.fori_loop` chunks, donated state), laid on the
runs mesh `train` would use. Printed per S: seconds per step, seed-steps per second and their ratio to S
seeds one after another, XLA's FLOP count of one step, GFLOP/s and its share of an fp32 matmul peak
measured in the same process. With torch installed (the `bench` extra) the same model and optimizer in
eager PyTorch, one seed, is timed in the same process. `--cpu-devices=1,2` times each count in its own
process (JAX fixes the count at start) and `--workers=2` times two processes at once, each with half the
seeds: the ways of using a CPU's cores that docs/performance.md compares. Data is the study's
`sample_data` (random, of its shapes, where it reads files): a step's cost does not depend on its values.
Prints tables, then one JSON line; measures, never asserts.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import resource
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import torch_gotu
from maskjax import overrides, store
from maskjax.cli.driver import Parser, name_list, positive_int, run_main
from maskjax.errors import ConfigError
from maskjax.optim import TrainConfig
from maskjax.sharding import runs_mesh
from maskjax.study import Plan, get_study, study_names
from maskjax.train import Program, RunState, TrainInputs, init_runs


class StepSetup(NamedTuple):
    """A study at one preset: what it is, its group of S seeds' training inputs, and its PyTorch peer's
    seconds per step (steps, repeats) -> float, None for a study without one."""

    describe: str
    batch: Callable[[list[int]], TrainInputs]
    torch_seconds: Callable[[int, int], float] | None


def int_list(text: str) -> list[int]:
    try:
        values = [int(t) for t in name_list(text)]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated positive integers, got {text!r}") from None
    if min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected comma-separated positive integers, got {text!r}")
    return values


def configured(config: Any, dtype: str, sets: list[str]) -> Any:
    """The preset with the matmul dtype, then the user's --set overrides."""
    return overrides.apply(dataclasses.replace(config, model=dataclasses.replace(config.model, dtype=dtype)), sets)


def dims(model: Any) -> tuple[int, int, int, int, int]:
    return model.dim, model.depth, model.heads, model.head_dim, model.mlp_dim


def study_setup(name: str, preset: str, method_name: str, dtype: str, sets: list[str]) -> StepSetup:
    """Any registered study's step: the first group of its `benchmark_scope` for the method, built by the
    study's own `build` on its `sample_data`, as training builds it."""
    study = get_study(name)
    config = configured(study.preset(preset), dtype, sets)
    scope = study.benchmark_scope if study.benchmark_scope is not None else study.scope_type()
    study.check(config, scope)
    methods = study.resolve_methods([method_name], config, scope)
    data = study.sample_data(config, scope)
    group = study.groups(Plan(config, scope, tuple(methods), (0,), data, None))[0]

    def batch(seeds: list[int]) -> TrainInputs:
        return study.build(config, group.spec, seeds).inputs

    train_config = batch([0]).train_config
    peer = TORCH_PEERS.get(name)
    m = config.model
    describe = f"{group.label}, {m.dim} x {m.depth}, {m.heads} heads, batch {train_config.batch_size}"
    return StepSetup(describe, batch, None if peer is None else peer(config, group.spec, train_config))


def boolean_peer(config: Any, spec: Any, train_config: TrainConfig) -> Callable[[int, int], float]:
    return lambda steps, repeats: torch_gotu.time_steps(
        spec.task.n_bits, dims(config.model), train_config.batch_size, steps, repeats
    )


def arithmetic_peer(config: Any, spec: Any, train_config: TrainConfig) -> Callable[[int, int], float]:
    from benchmarks import torch_peers
    from maskjax.tasks import arithmetic as ar

    return lambda steps, repeats: torch_peers.time_arithmetic_steps(
        ar.VOCAB,
        spec.task.length,
        ar.PROMPT,
        dims(config.model),
        train_config.batch_size,
        steps,
        repeats,
        config.learning_rate,
        config.weight_decay,
    )


def vision_peer(config: Any, spec: Any, train_config: TrainConfig) -> Callable[[int, int], float]:
    from benchmarks import torch_peers
    from maskjax.studies import vision

    data, task = spec.data, vision.make_task(spec.data, config)
    return lambda steps, repeats: torch_peers.time_vision_steps(
        data.train_images.shape[1:],
        data.num_classes,
        config.patch_size,
        dims(config.model),
        train_config.batch_size,
        steps,
        repeats,
        config.crop_pad,
        task.flip,
        config.learning_rate,
        config.weight_decay,
        config.clip_norm,
    )


def language_peer(config: Any, spec: Any, train_config: TrainConfig) -> Callable[[int, int], float]:
    from benchmarks import torch_peers

    return lambda steps, repeats: torch_peers.time_language_steps(
        config.vocab_size,
        config.context,
        dims(config.model),
        train_config.batch_size,
        steps,
        repeats,
        config.learning_rate,
        config.weight_decay,
        config.clip_norm,
    )


# The eager PyTorch peer of each built-in study (benchmarks/torch_gotu.py, torch_peers.py); another study has none.
TORCH_PEERS = {"boolean": boolean_peer, "arithmetic": arithmetic_peer, "vision": vision_peer, "language": language_peer}
DEFAULT_STEPS = {"boolean": 50, "arithmetic": 50, "vision": 20, "language": 10}
OTHER_STEPS = 20


def matmul_peak(dtype: str = "float32", size: int = 2048, repeats: int = 5) -> float:
    """Best FLOP/s of one jitted size x size matmul in this process."""
    a = jax.random.normal(jax.random.key(0), (size, size), dtype)
    matmul = jax.jit(lambda a, b: a @ b)
    matmul(a, a).block_until_ready()
    best = np.inf
    for _ in range(repeats):
        started = time.perf_counter()
        matmul(a, a).block_until_ready()
        best = min(best, time.perf_counter() - started)
    return 2 * size**3 / best


def seconds_per_step(chunk, state, data, steps: int, repeats: int, chunk_steps: int | None = None) -> float:
    """The best of `repeats` timed chunks of `steps` steps, after one untimed chunk (compilation, warm-up).

    With chunk_steps, what a chunk costs besides its steps (drawing its epochs' example orders, a sort
    per epoch; the call itself), timed on empty chunks, is spread over chunk_steps steps as training
    spreads it, not over the `steps` timed here. Where the steps cost less than the timer's noise (a few
    tiny steps), the empty chunk can time slower than the full one; the steps then count as free rather
    than negative."""

    def best_of(n_steps: int) -> float:
        nonlocal state
        best, start = np.inf, 0
        for _ in range(repeats):
            started = time.perf_counter()
            state, losses = chunk(state, data, jnp.asarray(start), jnp.asarray(n_steps))
            jax.block_until_ready(losses)
            best, start = min(best, time.perf_counter() - started), start + n_steps
        return best

    state, losses = chunk(state, data, jnp.asarray(0), jnp.asarray(steps))
    jax.block_until_ready(losses)
    timed = best_of(steps)
    if chunk_steps is None:
        return float(timed / steps)
    overhead = best_of(0)
    return float(max(timed - overhead, 0.0) / steps + overhead / chunk_steps)


def cost(compiled) -> dict:
    analysis = compiled.cost_analysis()
    return analysis[0] if isinstance(analysis, list) else analysis


def prepare(batch: TrainInputs) -> tuple[Program, RunState, Any, jax.sharding.Mesh]:
    """The group's compiled program, initial state and data, laid on the mesh `train` would give it."""
    program = batch.program()
    mesh = runs_mesh(len(batch.run_keys))
    return program, init_runs(program, batch.run_keys, batch.run_inputs, mesh), batch.laid_out(mesh), mesh


def time_batch(batch: TrainInputs, steps: int, repeats: int) -> dict:
    """Seconds per step of one batch of runs on the mesh `train` would give it, in chunks of the study's own
    length (`seconds_per_step`), with XLA's FLOP and memory counts of one step."""
    n_runs = len(batch.run_keys)
    train_config = batch.train_config
    steps = min(steps, train_config.chunk_steps)
    program, state, data, mesh = prepare(batch)
    step = program.step.lower(state, data, jnp.asarray(0)).compile()
    chunk = program.chunk.lower(state, data, jnp.asarray(0), jnp.asarray(steps)).compile()
    seconds = seconds_per_step(chunk, state, data, steps, repeats, train_config.chunk_steps)
    memory = chunk.memory_analysis()
    flops = float(cost(step)["flops"]) * mesh.size  # XLA counts one device's share
    return {
        "seeds": n_runs,
        "devices": mesh.size,
        "step_seconds": seconds,
        "seed_steps_per_s": n_runs / seconds,
        "flops_per_step": flops,
        "flops_per_s": flops / seconds,
        "xla_memory_bytes": int(memory.argument_size_in_bytes + memory.temp_size_in_bytes) if memory else None,
    }


def peak_memory_bytes() -> int:
    """The accelerator's peak bytes in use where it reports them, else this process's peak RSS."""
    stats = jax.devices()[0].memory_stats() or {}
    if "peak_bytes_in_use" in stats:
        return int(stats["peak_bytes_in_use"])
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def table(rows: list[dict], peak: float, torch_seconds: float | None) -> str:
    """One row per (way, seeds): time, throughput against one seed of the same way and against torch."""
    lines = [
        "| way | seeds | s/step | seed-steps/s | vs 1 seed sequential | vs torch | GFLOP/step | GFLOP/s | of peak |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    single = [r["seed_steps_per_s"] for r in rows if r["seeds"] == 1]
    one_device = [r["seed_steps_per_s"] for r in rows if r["seeds"] == 1 and r["way"] == way_name(1)]
    baseline = (one_device or single or [None])[0]
    for r in rows:
        versus = f"{r['seed_steps_per_s'] / baseline:.2f}x" if baseline else "-"
        torch = f"{r['seed_steps_per_s'] * torch_seconds:.2f}x" if torch_seconds else "-"
        lines.append(
            f"| {r['way']} | {r['seeds']} | {r['step_seconds']:.4g} | {r['seed_steps_per_s']:.1f} | {versus} | {torch} "
            f"| {r['flops_per_step'] / 1e9:.3f} | {r['flops_per_s'] / 1e9:.1f} | {r['flops_per_s'] / peak:.0%} |"
        )
    return "\n".join(lines)


def way_name(devices: int) -> str:
    return f"{devices} device{'s' if devices > 1 else ''}"


def study_xla_flags(parsed: argparse.Namespace) -> tuple[str, ...]:
    """The study's own XLA flags for the preset timed, as its CLI would apply them."""
    return get_study(parsed.study).xla_flags(parsed.preset) if parsed.study in study_names() else ()


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = Parser(
        prog="python -m benchmarks.step",
        description=__doc__.splitlines()[0],
        xla_flags=study_xla_flags,
    )
    p.add_argument("--study", required=True, help=f"whose step to time: {', '.join(study_names())}")
    p.add_argument("--preset", default="quick", help="a preset of the study (default quick)")
    p.add_argument("--method", default="vanilla", help="method whose step is timed (default vanilla)")
    p.add_argument("--seeds", type=int_list, default=[1, 4, 8], help="batch sizes in runs (default 1,4,8)")
    p.add_argument(
        "--steps",
        type=positive_int,
        help=f"steps per timed chunk (default: boolean/arithmetic 50, vision 20, language 10, others {OTHER_STEPS})",
    )
    p.add_argument("--repeats", type=positive_int, default=3, help="timed chunks; the best is kept (default 3)")
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32", help="matmul dtype")
    p.add_argument(
        "--compare",
        type=int_list,
        metavar="N,...",
        help="time each CPU device count N in its own process (e.g. 1,2), the runs sharded over them",
    )
    p.add_argument(
        "--workers",
        type=positive_int,
        help="also time this many processes at once, one device each, each with 1/W of the seeds",
    )
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="override a field of the study's config, e.g. --set model.dim=64 --set patch_size=7 (repeatable)",
    )
    p.add_argument("--no-torch", action="store_true", help="skip the PyTorch eager peer")
    p.add_argument("--json-only", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.workers and all(s % args.workers for s in args.seeds):
        raise ConfigError(f"--workers={args.workers} divides none of the --seeds counts {args.seeds}")
    return args


def child(args: argparse.Namespace, seeds: list[int], devices: int) -> subprocess.Popen:
    """This benchmark in a new process with `devices` CPU devices, timing batches of `seeds` runs and printing
    only its JSON line."""
    argv = [
        sys.executable,
        "-m",
        "benchmarks.step",
        f"--study={args.study}",
        f"--preset={args.preset}",
        f"--method={args.method}",
        f"--seeds={','.join(map(str, seeds))}",
        f"--steps={args.steps}",
        f"--repeats={args.repeats}",
        f"--dtype={args.dtype}",
        f"--cpu-devices={devices}",
        *(f"--set={text}" for text in args.set),
        *([f"--xla-flags={args.xla_flags}"] if args.xla_flags else []),
        "--no-torch",
        "--json-only",
    ]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)


def collect(process: subprocess.Popen) -> dict:
    out, _ = process.communicate()
    if process.returncode:
        raise RuntimeError(f"benchmark process failed with exit code {process.returncode}")
    return json.loads(out.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.steps = args.steps or DEFAULT_STEPS.get(args.study, OTHER_STEPS)
    study = study_setup(args.study, args.preset, args.method, args.dtype, args.set)
    env = store.environment()
    say = (lambda message: None) if args.json_only else (lambda message: print(message, file=sys.stderr, flush=True))
    say(f"devices: {env['devices']}  jax {env['jax_version']}  commit {env['git_commit']}")
    say(f"XLA_FLAGS: {env['xla_flags'] or '(none)'}")
    peak = matmul_peak()
    say(f"fp32 matmul peak: {peak / 1e9:.1f} GFLOP/s")
    say(
        f"{args.study} {args.preset}: {study.describe}; {args.method}, {args.dtype}; "
        f"{args.steps} steps x {args.repeats}" + (f"; set {', '.join(args.set)}" if args.set else "")
    )
    rows = []
    if args.compare:
        for devices in args.compare:
            for row in collect(child(args, args.seeds, devices))["rows"]:
                rows.append({**row, "way": way_name(devices)})
                say(f"  {rows[-1]['way']}, {row['seeds']} seeds: {row['step_seconds']:.4g} s/step")
    else:
        for seeds in args.seeds:
            row = time_batch(study.batch(list(range(seeds))), args.steps, args.repeats)
            rows.append({"way": way_name(jax.device_count()), **row})
            say(
                f"  {seeds} seeds: {row['step_seconds']:.4g} s/step "
                f"on {row['devices']} of {jax.device_count()} device(s)"
            )
    if args.workers:
        for seeds in [s for s in args.seeds if s % args.workers == 0]:
            share = seeds // args.workers
            processes = [child(args, [share], 1) for _ in range(args.workers)]
            parts = [collect(p)["rows"][0] for p in processes]
            slowest = max(p["step_seconds"] for p in parts)
            rows.append(
                {
                    "way": f"{args.workers} processes",
                    "seeds": seeds,
                    "devices": args.workers,
                    "step_seconds": slowest,
                    "seed_steps_per_s": sum(p["seed_steps_per_s"] for p in parts),
                    "flops_per_step": sum(p["flops_per_step"] for p in parts),
                    "flops_per_s": sum(p["flops_per_s"] for p in parts),
                }
            )
            say(f"  {args.workers} processes, {seeds} seeds: {slowest:.4g} s/step")
    torch_seconds = None
    result = {
        "study": args.study,
        "preset": args.preset,
        "method": args.method,
        "dtype": args.dtype,
        "matmul_peak_flops": peak,
        "rows": rows,
        **env,
    }
    if not args.no_torch and study.torch_seconds is not None and torch_gotu.version() is not None:
        torch_seconds = study.torch_seconds(args.steps, args.repeats)
        result["torch"] = {"version": torch_gotu.version(), "step_seconds": torch_seconds}
        say(f"  torch eager, 1 seed: {torch_seconds:.4g} s/step")
    result["peak_memory_bytes"] = peak_memory_bytes()
    if not args.json_only:
        torch_line = (
            f"; torch {torch_gotu.version()} eager, one seed: {torch_seconds:.4g} s/step" if torch_seconds else ""
        )
        print(f"\n## {args.study} {args.preset} ({study.describe}; {args.method}, {args.dtype})\n")
        print(f"fp32 matmul peak {peak / 1e9:.1f} GFLOP/s{torch_line}\n")
        print(table(rows, peak, torch_seconds))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
