"""One summary of Boolean runs kept in several folders: python -m experiments.summarize DIR [DIR ...] --out=FILE

A sweep too long for one sitting is split by task or seed range into folders; this reads their
results.jsonl and writes the summary.md every Boolean run writes (mean +- std beside the MDI, seeds
above the MDI with Fisher's exact test against vanilla, per-seed tables), headed by each folder's
commit. --by adds keys to group on (optimizer, mask_weight_decay, ...). The same (group, seed) in two
folders is refused. --plots also writes accuracy.png and the probe plots of every task (loss_TASK.png,
drift_TASK.png, gradients_TASK.png, mask_change_TASK.png) beside --out.
"""

from __future__ import annotations

import sys
from pathlib import Path

from maskjax import plots, store
from maskjax.cli.driver import Parser, UserError, name_list, read_result_folders, run_main, source_line
from maskjax.studies import boolean as study
from maskjax.studies import boolean_plots
from maskjax.tasks.boolean import get_task


def parse_args(argv: list[str] | None):
    p = Parser(prog="python -m experiments.summarize", description=__doc__.splitlines()[0])
    p.add_argument("dirs", type=Path, nargs="+", help="results folders holding results.jsonl")
    p.add_argument("--out", type=Path, required=True, help="the markdown file to write")
    p.add_argument("--by", type=name_list, default=["task", "method"], help="record keys to group on")
    p.add_argument("--plots", action="store_true", help="write the accuracy and probe plots beside --out")
    p.add_argument("--title", default="Boolean GOTU study", help="the page's heading")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    store.ensure_writable_dir(args.out.parent)
    records, sources = [], []
    for folder, found in read_result_folders(args.dirs):
        sources.append(source_line(folder, found))
        records += found
    missing = sorted({k for r in records for k in args.by if k not in r})
    if missing:
        raise UserError(f"records lack the grouping keys {', '.join(missing)}")
    keys = [(tuple(str(r[k]) for k in args.by), r["seed"]) for r in records]
    if len(set(keys)) != len(keys):
        raise UserError("the same group and seed appear twice in these folders")
    reference = [study.mdi_record(get_task(t)) for t in dict.fromkeys(r["task"] for r in records)]
    body = study.summary_markdown(records, reference, tuple(args.by))
    store.write_atomic(args.out, f"# {args.title}\n\nFrom:\n" + "\n".join(sources) + "\n\n" + body)
    if args.plots:
        plots.plot_accuracy(reference + records, args.out.parent / "accuracy.png")
        for task in dict.fromkeys(r["task"] for r in records):
            boolean_plots.plot_probes(args.out.parent, task, [r for r in records if r["task"] == task])
    print(body, end="")
    print(f"written to {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
