"""What the per-chunk probes cost a Boolean run: python -m benchmarks.probe_cost --preset=quick

Two measurements, per method, on 2Parity with one seed:
- through the CLI, as a user runs it: the wall time of `experiments.boolean --steps=S` and
  `--steps=S+K*chunk` in fresh processes; their difference is K more chunks of training and K more
  probes (and, before the chunk program took its length as an argument, one more compile). Divided by
  K*chunk steps and set against the bare step of `benchmarks.train_step`'s timing, it gives the
  overhead on top of the training it measures (K = --chunks; process start-up noise shrinks as 1/K).
- in process: the probe's compile time and the time of one probe call, set against the bare training
  time of a whole run at the preset (every chunk end is probed, and once at init).
Prints a table and a final JSON line; asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time

import jax

from benchmarks.train_step import time_batch
from maskjax import store
from maskjax.cli.driver import Parser, name_list, positive_int, run_main
from maskjax.methods import get_method
from maskjax.studies import boolean as study
from maskjax.tasks.boolean import get_task
from maskjax.train import init_runs


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = Parser(prog="python -m benchmarks.probe_cost", description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="quick", help="paper, quick or test (default quick)")
    p.add_argument("--methods", type=name_list, default=["vanilla", "mask"], help="comma list (default vanilla,mask)")
    p.add_argument("--short", type=positive_int, default=50, help="steps of the shorter CLI run (default 50)")
    p.add_argument("--chunks", type=positive_int, default=4, help="chunks between the two CLI runs (default 4)")
    p.add_argument("--repeats", type=positive_int, default=3, help="timed probe calls; the best is kept")
    return p.parse_args(argv)


def cli_seconds(method: str, preset: str, steps: int) -> float:
    """Wall time of one fresh `python -m experiments.boolean` process at one seed."""
    with tempfile.TemporaryDirectory() as out:
        command = [sys.executable, "-m", "experiments.boolean", f"--preset={preset}", "--seeds=1"]
        command += [f"--methods={method}", f"--steps={steps}", f"--out={out}"]
        started = time.perf_counter()
        subprocess.run(command, check=True, capture_output=True)
        return time.perf_counter() - started


def probe_seconds(config: study.BooleanConfig, method_name: str, repeats: int) -> tuple[float, float]:
    """(compile seconds, best seconds per call) of one seed's drift probe."""
    task, method = get_task("2parity"), get_method(method_name)
    inputs = study.make_group(study.BooleanGroup(task, method), [0], config).inputs
    state = init_runs(inputs.program(), inputs.run_keys, inputs.run_inputs)
    probe = inputs.probe
    started = time.perf_counter()
    measure = jax.jit(jax.vmap(probe)).lower(state, state).compile()
    compile_seconds = time.perf_counter() - started
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        jax.block_until_ready(measure(state, state))
        best = min(best, time.perf_counter() - started)
    return compile_seconds, best


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    config = study.STUDY.preset(args.preset)
    chunk = config.chunk_steps
    run_steps = config.train_config(get_task("2parity")).steps
    probes_per_run = len(range(0, run_steps, chunk)) + 1
    rows = []
    for name in args.methods:
        short = cli_seconds(name, args.preset, args.short)
        long = cli_seconds(name, args.preset, args.short + args.chunks * chunk)
        bare = time_batch(config, get_task("2parity"), get_method(name), 1, 50, 3)["step_seconds"]
        compile_seconds, call_seconds = probe_seconds(config, name, args.repeats)
        cli_step = (long - short) / (args.chunks * chunk)
        run_seconds = bare * run_steps
        rows.append(
            {
                "method": name,
                "bare_step_s": bare,
                "cli_step_s": cli_step,
                "cli_overhead": cli_step / bare - 1,
                "probe_compile_s": compile_seconds,
                "probe_call_s": call_seconds,
                "probes_share_of_run": (compile_seconds + probes_per_run * call_seconds) / run_seconds,
            }
        )
    long_steps = args.short + args.chunks * chunk
    print(f"2Parity, {args.preset} preset, one seed; CLI runs of {args.short} and {long_steps} steps")
    print(f"(chunks of {chunk}); a whole run is {run_steps} steps with {probes_per_run} probes.\n")
    print("| method | bare s/step | CLI s/step | CLI over bare | probe compile s | probe call s | probes / run |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['method']} | {r['bare_step_s']:.4f} | {r['cli_step_s']:.4f} | {100 * r['cli_overhead']:+.0f}% "
            f"| {r['probe_compile_s']:.2f} | {r['probe_call_s']:.4f} | {100 * r['probes_share_of_run']:.1f}% |"
        )
    print(json.dumps({"preset": args.preset, "rows": rows, **store.environment()}))
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
