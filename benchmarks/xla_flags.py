"""XLA CPU flags per study, chosen by measurement: python -m benchmarks.xla_flags --studies=boolean,language

Times each study's step (`benchmarks.step`, one process per flag set, the study's own flags off) under XLA's
defaults and under each candidate flag set, at each seed count, and prints seconds per step, each
candidate's speed-up over the defaults, and the pick: the candidate with the largest mean speed-up over
the seed counts, if it is at least `--margin` faster at every one of them, else none. A pick goes into the
study's `cpu_xla_flags` by hand, with this output saved under docs/benchmarks/ (the records then name the
flags). Run it on an idle machine. Measures, never asserts.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from statistics import mean

from benchmarks.step import int_list
from maskjax import store
from maskjax.cli.driver import Parser, name_list, positive_float, positive_int, run_main
from maskjax.errors import ConfigError
from maskjax.study import study_names

CANDIDATES = (
    "--xla_cpu_experimental_ynn_fusion_type=dot",
    "--xla_cpu_experimental_ynn_fusion_type=individual_dot",
    "--xla_cpu_use_onednn=true",
)


def flag_list(text: str) -> list[str]:
    """--candidates: flag sets separated by commas, the flags of one set by spaces."""
    sets = [t.strip() for t in text.split(",") if t.strip()]
    if not sets or any(not f.startswith("--xla_") for s in sets for f in s.split()):
        raise ValueError(f"expected XLA flags (--xla_...), comma-separated sets, got {text!r}")
    return sets


def time_step(study: str, preset: str, seeds: list[int], flags: str, timing: list[str]) -> dict[int, float]:
    """Seconds per step by seed count, in a fresh process whose XLA_FLAGS are the user's plus `flags`;
    `timing` passes --cpu-devices, --steps and --repeats on to `benchmarks.step`."""
    env = {**os.environ, "XLA_FLAGS": " ".join([os.environ.get("XLA_FLAGS", ""), flags]).strip()}
    argv = [
        sys.executable,
        "-m",
        "benchmarks.step",
        f"--study={study}",
        f"--preset={preset}",
        f"--seeds={','.join(map(str, seeds))}",
        "--no-torch",
        "--json-only",
        "--xla-flags=off",
        *timing,
    ]
    done = subprocess.run(argv, env=env, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"benchmarks.step failed under {flags or 'the defaults'}: {done.stderr.strip()[-500:]}")
    rows = json.loads(done.stdout.strip().splitlines()[-1])["rows"]
    return {row["seeds"]: row["step_seconds"] for row in rows}


def pick(default: dict[int, float], timed: dict[str, dict[int, float]], margin: float) -> str | None:
    """The candidate with the largest mean speed-up, if at least `margin` faster at every seed count."""
    speedups = {flags: {s: default[s] / seconds[s] for s in default} for flags, seconds in timed.items()}
    fast = {flags: mean(up.values()) for flags, up in speedups.items() if min(up.values()) >= 1 + margin}
    return max(fast, key=fast.get) if fast else None


def main(argv: list[str] | None = None) -> int:
    p = Parser(prog="python -m benchmarks.xla_flags", description=__doc__.splitlines()[0])
    p.add_argument("--studies", type=name_list, default=list(study_names()), help="studies to time (default all)")
    p.add_argument("--preset", default="quick", help="the preset of every study timed (default quick)")
    p.add_argument("--seeds", type=int_list, default=[1, 8], help="batch sizes in runs (default 1,8)")
    p.add_argument("--candidates", type=flag_list, default=list(CANDIDATES), help="flag sets to try, comma-separated")
    p.add_argument("--margin", type=positive_float, default=0.05, help="least speed-up a pick needs (default 0.05)")
    p.add_argument("--steps", type=positive_int, help="steps per timed chunk (default: benchmarks.step's)")
    p.add_argument("--repeats", type=positive_int, help="timed chunks, the best kept (default: benchmarks.step's)")
    args = p.parse_args(argv)
    timing = [
        f"--{name.replace('_', '-')}={value}"
        for name in ("cpu_devices", "steps", "repeats")
        if (value := getattr(args, name)) is not None
    ]
    unknown = sorted(set(args.studies) - set(study_names()))
    if unknown:
        raise ConfigError(f"unknown studies {unknown}; known: {', '.join(study_names())}")
    env = store.environment()
    print(
        f"# benchmarks.xla_flags --preset={args.preset} --seeds={','.join(map(str, args.seeds))}; "
        f"commit {env['git_commit']}, jax {env['jax_version']}, user XLA_FLAGS {os.environ.get('XLA_FLAGS', '')!r}"
    )
    print("| study | flags | " + " | ".join(f"{s} seeds (s/step)" for s in args.seeds) + " | speed-up |")
    print("|---|---|" + "---|" * len(args.seeds) + "---|")
    picks = {}
    for study in args.studies:
        default = time_step(study, args.preset, args.seeds, "", timing)
        print(f"| {study} | (defaults) | " + " | ".join(f"{default[s]:.4g}" for s in args.seeds) + " | 1 |", flush=True)
        timed = {}
        for flags in args.candidates:
            timed[flags] = time_step(study, args.preset, args.seeds, flags, timing)
            ups = " / ".join(f"{default[s] / timed[flags][s]:.2f}" for s in args.seeds)
            print(
                f"| {study} | {flags} | " + " | ".join(f"{timed[flags][s]:.4g}" for s in args.seeds) + f" | {ups} |",
                flush=True,
            )
        picks[study] = pick(default, timed, args.margin)
    print()
    for study, flags in picks.items():
        print(f"{study}: {flags or 'none (XLA defaults)'}")
    print(json.dumps({"preset": args.preset, "seeds": args.seeds, "picks": picks, **env}))
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
