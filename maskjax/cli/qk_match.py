"""How well each prior matches its target at init, without training: python -m experiments.qk_match --preset=paper

Initialises every (task, method) group exactly as experiments.boolean does and reports
pattern_error_init: the mean total-variation distance between layer 0's attention rows on 512 cube
points and the oracle target's rows (0 = the pattern, 1 = disjoint). The QK priors' scale constants
were set at the quick width; this checks them at any other size in seconds to minutes, not hours.
Writes results.jsonl, summary.md and config.json to --out.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

from maskjax import store, tables
from maskjax.cli.driver import Parser, add_config_flags, config_from_args, name_list, progress, run_main
from maskjax.runner import RunControl, open_sweep
from maskjax.studies import boolean as study
from maskjax.tasks.boolean import PAPER_TASKS, TASKS


def parse_args(argv: list[str] | None):
    p = Parser(prog="python -m experiments.qk_match", description=__doc__.splitlines()[0])
    p.add_argument(
        "--tasks",
        type=name_list,
        default=list(PAPER_TASKS),
        help=f"comma list of {','.join(TASKS)} (default: the paper's four)",
    )
    p.add_argument(
        "--methods", type=name_list, default=["vanilla", "mask", "qk_svd", "qk_opt", "mimetic"], help="comma list"
    )
    p.add_argument("--out", type=Path, default=Path("results/qk_match"), help="output folder")
    add_config_flags(p, study.STUDY, with_run_control=False)
    p.add_argument("--overwrite", action="store_true", help="replace results of a different config in --out")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    config = config_from_args(study.STUDY, args)
    tasks, methods = study.STUDY.resolve(config, study.BooleanScope(tasks=tuple(args.tasks)), args.methods, progress)
    seeds = args.seeds
    resolved = {"study": "qk_match", "tasks": args.tasks, "methods": args.methods, "seeds": seeds}
    resolved.update(dataclasses.asdict(config))
    _, meta = open_sweep(args.out, resolved, RunControl(overwrite=args.overwrite))
    records = []
    for task in tasks:
        for method in methods:
            errors = study.init_pattern_errors(task, method, seeds, config)
            progress(f"{task.name} {method.name}: pattern_error_init {tables.mean_std(errors)}")
            batch = {"task": task.name, "method": method.name, **meta}
            records += [{**batch, "seed": s, "pattern_error_init": e} for s, e in zip(seeds, errors, strict=True)]
            store.write_jsonl(args.out / "results.jsonl", records)
    table = tables.summary_table(records, ["pattern_error_init"], ("task", "method"))
    store.write_atomic(args.out / "summary.md", f"# Pattern match at init ({config.preset})\n\n" + table)
    print(table, end="")
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
