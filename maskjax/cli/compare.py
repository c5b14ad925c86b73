"""Are two sets of runs the same? python -m experiments.compare OLD_DIR NEW_DIR [--keys=...]

Matches records of the two folders by (task, method, seed, and the mask's open / closed values when
present) and reports, per task and method, how many matched records agree exactly on each key
(default: the accuracy and loss columns, which depend on training alone) and the largest absolute
difference; records that lack a key (written before it existed) are counted apart, not as a difference.
The training is deterministic, so a change that only touches measurement must leave these identical.
With --strict the exit code is 1 when any matched value differs.
"""

from __future__ import annotations

import sys
from pathlib import Path

from maskjax import store
from maskjax.cli.driver import Parser, UserError, name_list, run_main

KEYS = ("acc_all", "acc_unseen", "mse", "unseen_mean_prediction", "train_loss", "degree_profile")


def parse_args(argv: list[str] | None):
    p = Parser(prog="python -m experiments.compare", description=__doc__.splitlines()[0])
    p.add_argument("old", type=Path, help="a results folder")
    p.add_argument("new", type=Path, help="a results folder")
    p.add_argument("--keys", type=name_list, default=list(KEYS), help=f"record keys (default {','.join(KEYS)})")
    p.add_argument("--strict", action="store_true", help="exit 1 when a matched value differs")
    return p.parse_args(argv)


def identity(record: dict) -> tuple:
    return tuple(record.get(k) for k in ("task", "method", "seed", "open_value", "closed_value"))


def load(folder: Path) -> dict[tuple, dict]:
    path = folder / "results.jsonl"
    if not path.is_file():
        raise UserError(f"{path} does not exist")
    return {identity(r): r for r in store.read_jsonl(path) if "seed" in r}


def difference(a, b) -> float:
    if isinstance(a, list):
        return max((difference(x, y) for x, y in zip(a, b, strict=True)), default=0.0)
    if a is None or b is None:
        return 0.0 if a is b else float("inf")
    return abs(float(a) - float(b))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    old, new = load(args.old), load(args.new)
    shared = sorted(set(old) & set(new), key=str)
    if not shared:
        raise UserError(f"no run of {args.new} is in {args.old}")
    groups: dict[tuple, list[tuple]] = {}
    for key in shared:
        groups.setdefault(key[:2], []).append(key)
    lines = ["| task | method | runs | " + " | ".join(f"{k}: equal, max diff" for k in args.keys) + " |"]
    lines.append("|" + "---|" * (3 + len(args.keys)))
    differs = False
    for (task, method), keys in groups.items():
        cells = []
        for k in args.keys:
            both = [i for i in keys if k in old[i] and k in new[i]]
            diffs = [difference(old[i][k], new[i][k]) for i in both]
            equal = sum(d == 0 for d in diffs)
            differs |= equal < len(diffs)
            cell = f"{equal}/{len(diffs)}, {max(diffs):.3g}" if diffs else "-"
            if len(both) < len(keys):
                cell += f"; {len(keys) - len(both)} without it (older records)"
            cells.append(cell)
        lines.append(f"| {task} | {method} | {len(keys)} | " + " | ".join(cells) + " |")
    print("\n".join(lines))
    print(f"{len(shared)} runs in both; {len(new) - len(shared)} only in {args.new}", file=sys.stderr)
    return 1 if differs and args.strict else 0


if __name__ == "__main__":
    sys.exit(run_main(main))
