"""Mask contrast sweep: python -m experiments.contrast --seeds=8 --open=0.5,2,5,10 --closed=-0.5,-2,-5,-10

The whole grid (open x closed x seeds) is ONE vmapped group: the open and closed logits are per-run
numbers, not structure. Answers whether a low-contrast, genuinely learnable mask still persists, or
only a near-frozen +-10 one does. Writes results.jsonl, summary.md, config.json and a heat map.
"""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

import numpy as np

from maskjax import plots, store, tables
from maskjax.cli.driver import Parser, add_config_flags, config_from_args, float_list, progress, run_control, run_main
from maskjax.errors import ConfigError
from maskjax.runner import GroupSpec, run_sweep, sweep_record
from maskjax.studies import boolean as study
from maskjax.study import Plan

KEYS = ("acc_all", "acc_unseen", "mse", "unseen_mean_prediction", "train_loss")


def parse_args(argv: list[str] | None):
    p = Parser(prog="python -m experiments.contrast", description=__doc__.splitlines()[0])
    p.add_argument("--task", default="2parity", help="one Boolean task (default 2parity)")
    p.add_argument("--method", default="mask", help="a mask method: mask or mask_fixed (default mask)")
    p.add_argument("--open", type=float_list, default=[0.5, 2.0, 5.0, 10.0], help="open logits (comma list)")
    p.add_argument("--closed", type=float_list, default=[-0.5, -2.0, -5.0, -10.0], help="closed logits (comma list)")
    p.add_argument(
        "--out", type=Path, default=Path("results/contrast"), help="output folder (default results/contrast)"
    )
    add_config_flags(p, study.STUDY, exclude=("open_value", "closed_value"))
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    config = config_from_args(study.STUDY, args)
    scope = study.BooleanScope(tasks=(args.task,))
    (task,), (method,) = study.STUDY.resolve(config, scope, [args.method], progress)
    if method.mask_pattern != "oracle":
        raise ConfigError(f"--method={method.name}: the contrast sweep needs a method with the oracle mask")
    grid = list(itertools.product(args.open, args.closed))
    runs = [(o, c, seed) for o, c in grid for seed in args.seeds]
    plan = Plan(config, scope, (method,), tuple(args.seeds), [task], args.out)
    contrast = {"open": args.open, "closed": args.closed}
    resolved = {**sweep_record(study.STUDY, plan, [method.name]), "study": "contrast", "contrast": contrast}
    out = args.out

    def train(checkpoints, resume: bool) -> list[dict]:
        shape = f"{len(grid)} contrasts x {len(args.seeds)} seeds = {len(runs)} runs"
        progress(f"{task.name} {method.name}: {shape}, one batch")
        seeds = [seed for _, _, seed in runs]
        values = [(o, c) for o, c, _ in runs]
        group = study.BooleanGroup(task, method, tuple(values))
        return study.STUDY.run(config, group, seeds, progress, checkpoints, resume, f"{task.name} {method.name}")[0]

    grid_batch = GroupSpec("grid", {"task": task.name, "method": method.name}, len(runs), train)
    records = run_sweep(out, resolved, [grid_batch], write_jsonl, run_control(args), progress)
    table = write_summary(out, task, method, records)
    plot_grid(records, args.open, args.closed, out / "contrast.png", f"{task.name} {method.name}: acc_all (%)")
    print(table, end="")
    print(f"results in {out}/ (results.jsonl, summary.md, config.json, contrast.png)", file=sys.stderr)
    return 0


def plot_grid(records: list[dict], opens: list[float], closeds: list[float], path: Path, title: str) -> None:
    """Mean acc_all over seeds as a heat map, open logits down, closed logits across."""
    grid = np.full((len(opens), len(closeds)), np.nan)
    for i, o in enumerate(opens):
        for j, c in enumerate(closeds):
            values = [
                r["acc_all"]
                for r in records
                if r["open_value"] == o and r["closed_value"] == c and r["acc_all"] is not None
            ]
            if values:
                grid[i, j] = 100 * np.mean(values)
    plots.plot_heatmap(grid, [f"{o:g}" for o in opens], [f"{c:g}" for c in closeds], path, title)


def write_jsonl(out: Path, records: list[dict]) -> None:
    store.write_jsonl(out / "results.jsonl", records)


def write_summary(out: Path, task, method, records: list[dict]) -> str:
    """summary.md: mean +- std per contrast, the seeds that reach / exceed the MDI, the values per seed."""
    groups = ("open_value", "closed_value")
    table = tables.summary_table(records, KEYS, groups)
    counts = tables.count_table(records, [study.mdi_record(task)], groups)
    seeds = tables.per_seed_table(records, "acc_all", groups)
    page = f"# Contrast sweep: {task.name}, {method.name}\n\n{table}\n"
    store.write_atomic(out / "summary.md", f"{page}Seeds that reach / exceed the MDI:\n\n{counts}\n{seeds}")
    return table


if __name__ == "__main__":
    sys.exit(run_main(main))
