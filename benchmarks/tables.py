"""One before/after table from saved `benchmarks.step` outputs: python -m benchmarks.tables BEFORE AFTER

Each file is a `benchmarks.step` output whose last line is its JSON. Rows: every (way, seeds) of BEFORE,
then of AFTER, each labelled with its commit; throughput is set against BEFORE's one seed on one device,
and against the PyTorch peer timed in AFTER's process. docs/performance.md's tables are this output.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from maskjax.cli.driver import Parser, UserError, run_main


def read_result(path: Path) -> dict:
    try:
        return json.loads(path.read_text().strip().splitlines()[-1])
    except (OSError, IndexError, json.JSONDecodeError) as e:
        raise UserError(f"{path} does not end in a benchmarks.step JSON line ({e})") from None


def table(before: dict, after: dict) -> str:
    baseline = next(r for r in before["rows"] if r["seeds"] == 1 and r["devices"] == 1)["seed_steps_per_s"]
    torch = after.get("torch", {}).get("step_seconds")
    lines = [
        "| commit | way | seeds | s/step | seed-steps/s | vs before, 1 seed | vs torch | GFLOP/s | of peak |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for result in (before, after):
        for r in result["rows"]:
            versus_torch = f"{r['seed_steps_per_s'] * torch:.2f}x" if torch else "-"
            lines.append(
                f"| {result['git_commit'][:7]} | {r['way']} | {r['seeds']} | {r['step_seconds']:.4g} "
                f"| {r['seed_steps_per_s']:.1f} | {r['seed_steps_per_s'] / baseline:.2f}x | {versus_torch} "
                f"| {r['flops_per_s'] / 1e9:.1f} | {r['flops_per_s'] / result['matmul_peak_flops']:.0%} |"
            )
    peaks = ", ".join(f"{r['git_commit'][:7]} {r['matmul_peak_flops'] / 1e9:.0f}" for r in (before, after))
    torch_line = f"; PyTorch {after['torch']['version']} eager, one seed: {torch:.4g} s/step" if torch else ""
    return "\n".join(lines) + f"\n\nfp32 matmul peak, GFLOP/s: {peaks}{torch_line}."


def main(argv: list[str] | None = None) -> int:
    p = Parser(prog="python -m benchmarks.tables", description=__doc__.splitlines()[0])
    p.add_argument("before", type=Path, help="benchmarks.step output of the earlier commit")
    p.add_argument("after", type=Path, help="benchmarks.step output of the later commit")
    args = p.parse_args(argv)
    print(table(read_result(args.before), read_result(args.after)))
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
