"""How often the data finds the mask: python -m experiments.discover --seeds=8 --fractions=1,0.3,0.1,0.03

`maskjax.discover` reads the interaction pattern off a training set (finite differences on the cube).
Here every seed keeps a random fraction of each task's seen points and the pattern it yields is
compared with the oracle's. Fraction 1 is the training set the Boolean study uses. Seconds of numpy;
writes results.jsonl, summary.md, config.json and recovery.png.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from maskjax import discover, mask_patterns, plots, store, tables
from maskjax.cli.driver import Parser, fraction_list, name_list, positive_int, progress, run_main
from maskjax.runner import RunControl, open_sweep
from maskjax.tasks.boolean import TASKS, cube, get_task

KEYS = ("recovered", "missing_pairs", "extra_pairs", "untested_pairs", "n_train")


def parse_args(argv: list[str] | None):
    p = Parser(prog="python -m experiments.discover", description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=positive_int, default=8, help="random subsets per fraction (default 8)")
    p.add_argument(
        "--tasks", type=name_list, default=list(TASKS), help=f"comma list of {','.join(TASKS)} (default all)"
    )
    p.add_argument(
        "--fractions",
        type=fraction_list(include_one=True),
        default=[1.0, 0.3, 0.1, 0.03],
        help="fractions of the seen points kept",
    )
    p.add_argument("--row-policy", default="diagonal", choices=list(mask_patterns.ROW_POLICIES), help="mask row policy")
    p.add_argument(
        "--out", type=Path, default=Path("results/discover"), help="output folder (default results/discover)"
    )
    p.add_argument("--overwrite", action="store_true", help="replace results of a different config in --out")
    return p.parse_args(argv)


def subset_record(task, fraction: float, seed: int, row_policy: str) -> dict:
    """Discover the pattern from `fraction` of the task's seen points (drawn with `seed`) and score it."""
    points = cube(task.n_bits)
    seen = np.flatnonzero(np.asarray(task.seen(points), bool))
    keep = np.random.default_rng([seed, int(fraction * 1e6)]).permutation(seen)[: max(1, round(fraction * seen.size))]
    evidence = discover.interaction_evidence(points[keep], np.asarray(task.target(points[keep]), np.float64))
    groups = discover.learned_groups(evidence)
    learned = mask_patterns.group_pattern(task.n_bits, groups, row_policy)
    upper = np.triu(np.ones_like(evidence.pairs, bool), 1)
    return {
        "task": task.name,
        "train_fraction": fraction,
        "seed": seed,
        "n_train": int(keep.size),
        **discover.recovery(learned, mask_patterns.group_pattern(task.n_bits, task.groups, row_policy)),
        "untested_pairs": int(np.sum(upper & (evidence.pairs == discover.UNTESTED))),
        "groups": [list(g) for g in groups],
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    tasks = [get_task(t) for t in args.tasks]
    seeds = list(range(args.seeds))
    resolved = {
        "study": "discover",
        "tasks": args.tasks,
        "fractions": args.fractions,
        "seeds": seeds,
        "row_policy": args.row_policy,
    }
    _, meta = open_sweep(args.out, resolved, RunControl(overwrite=args.overwrite))
    records = []
    for task in tasks:
        for fraction in args.fractions:
            batch = [subset_record(task, fraction, seed, args.row_policy) for seed in seeds]
            progress(f"{task.name} {fraction:g}: recovered in {sum(r['recovered'] for r in batch)}/{len(seeds)} seeds")
            records += [{**r, **meta} for r in batch]
            store.write_jsonl(args.out / "results.jsonl", records)
    table = write_summary(args.out, records)
    plots.plot_curves(
        [{**r, "rule": "finite differences"} for r in records],
        args.out / "recovery.png",
        x="train_fraction",
        y="recovered",
        panel="rule",
        line="task",
    )
    print(table, end="")
    print(f"results in {args.out}/ (results.jsonl, summary.md, config.json, recovery.png)", file=sys.stderr)
    return 0


def write_summary(out: Path, records: list[dict]) -> str:
    """summary.md: mean +- std per task and fraction, and the recovery per seed."""
    table = tables.summary_table(records, KEYS, ("task", "train_fraction"))
    seeds = tables.per_seed_table(records, "recovered", ("task", "train_fraction"))
    store.write_atomic(out / "summary.md", f"# Interaction patterns found from the data\n\n{table}\n{seeds}")
    return table


if __name__ == "__main__":
    sys.exit(run_main(main))
