"""Where a study's step spends its time: python -m benchmarks.profile --study=boolean [--preset=quick]

Traces one chunk of one seed's training with `jax.profiler` (a Perfetto trace), sums each XLA kernel's
time per step, and names each kernel by the model operation XLA's metadata gives it (the `op_name` of
the fused computation's root in the compiled HLO). Prints the top kernels and the time per kernel kind
(fusion type: YNNPACK dot / elementwise fusions, copies, transposes, sorts...). Measures, never asserts.
"""

from __future__ import annotations

import collections
import dataclasses
import gzip
import json
import re
import sys
import tempfile
import time
from pathlib import Path

import jax
import jax.numpy as jnp

from benchmarks import step
from maskjax.cli.driver import Parser, positive_int, run_main
from maskjax.study import study_names
from maskjax.train import TrainInputs

# Trace events that are not one XLA kernel: the executor's own spans, Python frames, waits.
NOT_KERNELS = re.compile(r"^(\$|ThunkExecutor|SlinkyThreadPool|PjitFunction|TfrtCpu|Thunk::|.*trace)")


def kernel_seconds(trace_dir: Path) -> dict[str, float]:
    """Total seconds per kernel name in the Perfetto trace under trace_dir."""
    path = next(trace_dir.rglob("*.trace.json.gz"))
    events = json.loads(gzip.decompress(path.read_bytes()))
    events = events["traceEvents"] if isinstance(events, dict) else events
    totals: dict[str, float] = collections.Counter()
    for event in events:
        if event.get("ph") == "X" and not NOT_KERNELS.match(event["name"]):
            totals[event["name"]] += event.get("dur", 0) / 1e6
    return totals


def op_names(hlo_text: str) -> dict[str, str]:
    """Kernel name -> its shape and the model operation it came from: the instruction's metadata op_name, or,
    for a fusion without one, the op_name of its fused computation's root (else of any instruction in it)."""
    computation_ops: dict[str, str] = {}
    current, found, root = None, None, None
    for line in hlo_text.splitlines():
        header = re.match(r"^%?([\w.\-]+) \(.*\{$", line)
        if header:
            current, found, root = header.group(1), None, None
        elif current and line.startswith("}"):
            computation_ops[current] = root or found or ""
            current = None
        elif current:
            op = re.search(r'op_name="([^"]+)"', line)
            if op:
                found = found or op.group(1)
                root = op.group(1) if line.lstrip().startswith("ROOT") else root
    names = {}
    for line in hlo_text.splitlines():
        match = re.match(r"\s*(?:ROOT )?%([\w.\-]+) = (\S+) ", line)
        if not match:
            continue
        op = re.search(r'op_name="([^"]+)"', line)
        calls = re.search(r"calls=%([\w.\-]+)", line)
        where = op.group(1) if op else computation_ops.get(calls.group(1), "") if calls else ""
        where = re.sub(r"^jit\([^)]*\)/(vmap\(\)/)?(while/body/)?", "", where)
        names[match.group(1)] = f"{match.group(2)} {where}"
    return names


def profile(batch: TrainInputs, steps: int) -> tuple[float, dict[str, float], dict[str, str]]:
    """(seconds per step, kernel seconds per step, kernel -> operation) of one traced chunk of `steps`."""
    batch = batch._replace(train_config=dataclasses.replace(batch.train_config, chunk_steps=steps))
    program, state, data, _ = step.prepare(batch)
    chunk = program.chunk.lower(state, data, jnp.asarray(0), jnp.asarray(steps)).compile()
    state, losses = chunk(state, data, jnp.asarray(0), jnp.asarray(steps))
    jax.block_until_ready(losses)
    started = time.perf_counter()
    state, losses = chunk(state, data, jnp.asarray(steps), jnp.asarray(steps))
    jax.block_until_ready(losses)
    seconds = (time.perf_counter() - started) / steps
    with tempfile.TemporaryDirectory() as folder:
        with jax.profiler.trace(folder, create_perfetto_trace=True):
            state, losses = chunk(state, data, jnp.asarray(2 * steps), jnp.asarray(steps))
            jax.block_until_ready(losses)
        totals = kernel_seconds(Path(folder))
    return seconds, {k: v / steps for k, v in totals.items()}, op_names(chunk.as_text())


def main(argv: list[str] | None = None) -> int:
    p = Parser(prog="python -m benchmarks.profile", description=__doc__.splitlines()[0])
    p.add_argument("--study", required=True, help=f"whose step to profile: {', '.join(study_names())}")
    p.add_argument("--preset", default="quick", help="a preset of the study (default quick)")
    p.add_argument("--method", default="vanilla", help="method whose step is profiled (default vanilla)")
    p.add_argument("--seeds", type=positive_int, default=1, help="runs in the batch (default 1)")
    p.add_argument("--steps", type=positive_int, default=20, help="steps in the traced chunk (default 20)")
    p.add_argument("--top", type=positive_int, default=25, help="kernels listed (default 25)")
    p.add_argument(
        "--set", action="append", default=[], metavar="NAME=VALUE", help="override a field of the study's config"
    )
    args = p.parse_args(argv)
    study = step.study_setup(args.study, args.preset, args.method, "float32", args.set)
    seconds, per_step, names = profile(study.batch(list(range(args.seeds))), args.steps)
    total = sum(per_step.values())
    kinds: dict[str, float] = collections.Counter()
    for name, value in per_step.items():
        kinds[re.sub(r"\.\d+$", "", name)] += value
    print(f"## {args.study} {args.preset}, {args.seeds} seed(s), {args.method}: {study.describe}\n")
    print(
        f"{seconds * 1e3:.2f} ms a step; its kernels sum to {total * 1e3:.2f} ms ({len(per_step)} kernels; "
        "more than the step where the two cores overlap)\n"
    )
    print("| kernel kind | ms/step | share |\n|---|---|---|")
    for kind, value in kinds.most_common(12):
        print(f"| {kind} | {value * 1e3:.3f} | {value / total:.0%} |")
    print("\n| kernel | ms/step | what (HLO shape, model op) |\n|---|---|---|")
    for name, value in collections.Counter(per_step).most_common(args.top):
        print(f"| {name} | {value * 1e3:.3f} | {names.get(name, '')[:110]} |")
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
