"""Does the mask move less than the other priors, seed for seed? python -m experiments.persistence DIR [DIR ...]

Pairs every run with the `mask` run of the same task, row policy, optimizer, mask weight decay and seed, and
counts the seeds in which its layer-0 attention drifted further by the end of training
(`attention_drift`, the cube's mean), with a two-sided sign test. Prints one markdown table.
"""

from __future__ import annotations

import sys
from pathlib import Path

from maskjax import store, tables
from maskjax.cli.driver import Parser, UserError, run_main


def parse_args(argv: list[str] | None):
    p = Parser(prog="python -m experiments.persistence", description=__doc__.splitlines()[0])
    p.add_argument("dirs", type=Path, nargs="+", help="results folders holding results.jsonl")
    return p.parse_args(argv)


def condition(record: dict) -> tuple:
    row_policy = record.get("config", {}).get("row_policy", "diagonal")
    return record["task"], row_policy, record.get("optimizer", "adam"), record.get("mask_weight_decay")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    drift: dict[tuple, dict[int, float]] = {}
    for folder in args.dirs:
        path = folder / "results.jsonl"
        if not path.is_file():
            raise UserError(f"{path} does not exist")
        for r in store.read_jsonl(path):
            if "attention_drift" not in r:
                continue
            by_seed = drift.setdefault((condition(r), r["method"]), {})
            if r["seed"] in by_seed:
                raise UserError(f"{r['method']} seed {r['seed']} of {condition(r)} appears twice; pass each run once")
            by_seed[r["seed"]] = r["attention_drift"][-1][0]
    columns = ("task", "row policy", "optimizer", "mask decay", "method", "seeds paired", "drifts further than mask",
               "sign test p")
    lines = ["| " + " | ".join(columns) + " |"]
    lines.append("|---|---|---|---|---|---|---|---|")
    for (cond, method), by_seed in sorted(drift.items(), key=str):
        mask = drift.get((cond, "mask"))
        if method == "mask" or mask is None:
            continue
        diffs = [by_seed[s] - mask[s] for s in sorted(by_seed) if s in mask]
        further = sum(d > 0 for d in diffs)
        decay = "-" if cond[3] is None else cond[3]
        lines.append(
            f"| {cond[0]} | {cond[1]} | {cond[2]} | {decay} | {method} | {len(diffs)} | {further}/{len(diffs)} "
            f"| {tables.sign_test_p(diffs):.3g} |"
        )
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
