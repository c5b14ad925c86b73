"""The Boolean study across model sizes: python -m experiments.scale DIR [DIR ...] --out=FOLDER

Reads Boolean results folders of any presets (quick, the ladder's rungs w64d4 and w128d6, medium,
paper) and writes FOLDER/summary.md: the cost of a run per preset and task (training FLOPs and the
seconds the runs took), the vanilla rule that picks the medium preset per (preset, task), and per
(preset, task, method) acc_all, acc_unseen, the unseen mean prediction beside the MDI's and the
target's, the end loss and the seeds above the MDI with Fisher's exact test against vanilla; and
FOLDER/scale.png: acc_all and the unseen mean prediction against training FLOPs per run, one panel
per task. A mask run under a row policy other than `diagonal` is its own method, `mask (members)`; the
same (preset, task, method, seed) in two folders is refused.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from matplotlib.ticker import NullFormatter

from maskjax import plots, store, tables
from maskjax.cli.driver import Parser, UserError, read_result_folders, run_main, source_line
from maskjax.models.layers import ModelConfig
from maskjax.store import sweep_config
from maskjax.studies import boolean as study
from maskjax.studies import boolean_rules
from maskjax.tasks.boolean import cube, get_task

GROUP = ("preset", "task", "method")


def parse_args(argv: list[str] | None):
    p = Parser(prog="python -m experiments.scale", description=__doc__.splitlines()[0])
    p.add_argument("dirs", type=Path, nargs="+", help="Boolean results folders holding results.jsonl")
    p.add_argument("--out", type=Path, required=True, help="folder for summary.md and scale.png")
    p.add_argument("--methods", default=None, help="comma list of methods to keep (default: all)")
    return p.parse_args(argv)


NEEDED = ("task", "method", "seed", "steps", "acc_all", "train_loss", "batch_seconds", "runs_in_batch", "config")


def with_scale(record: dict, path: Path) -> dict:
    """The record with its preset and training FLOPs per run lifted to the top level; a mask run under a
    row policy other than the default is named `method (policy)`, so that it is its own group. A resumed
    run's seconds cover only its last part, so it has no run_seconds."""
    missing = [k for k in NEEDED if k not in record]
    if missing:
        raise UserError(f"{path}: a record lacks {', '.join(missing)} (not a Boolean results file of this code)")
    config = sweep_config(record["config"])
    task = get_task(record["task"])
    flops = boolean_rules.train_flops(ModelConfig(**config["model"]), task.n_bits + 1, config["batch_size"])
    method = record["method"]
    if config["row_policy"] != study.BooleanConfig.row_policy and method != "vanilla":
        method = f"{method} ({config['row_policy']})"
    return {
        **record,
        "method": method,
        "preset": config["preset"],
        "train_flops": flops * record["steps"],
        "run_seconds": None if record.get("resumed_at_step") else record["batch_seconds"] / record["runs_in_batch"],
    }


def read_folders(dirs: list[Path], methods: set[str] | None) -> tuple[list[dict], list[str]]:
    records, sources = [], []
    for folder, found in read_result_folders(dirs):
        path = folder / "results.jsonl"
        kept = [with_scale(r, path) for r in found if methods is None or r.get("method") in methods]
        sources.append(source_line(folder, kept))
        records += kept
    keys = [(*(r[k] for k in GROUP), r["seed"]) for r in records]
    if len(set(keys)) != len(keys):
        raise UserError("the same preset, task, method (row policy) and seed appear twice in these folders")
    if not records:
        raise UserError("no records in these folders")
    return records, sources


def unseen_target_mean(task_name: str) -> float:
    task = get_task(task_name)
    points = cube(task.n_bits)
    return float(np.mean(np.asarray(task.target(points))[~np.asarray(task.seen(points), bool)]))


def by_compute(records: list[dict]) -> list[tuple[str, str]]:
    """(preset, task) pairs ordered by task, then by training FLOPs."""
    pairs = {(r["preset"], r["task"]): r["train_flops"] for r in records}
    return sorted(pairs, key=lambda pair: (pair[1], pairs[pair]))


def cost_table(records: list[dict]) -> str:
    lines = [
        "| preset | task | model (dim x depth) | steps | GFLOP per run | seconds per run (measured) |",
        "|---|---|---|---|---|---|",
    ]
    for preset, task in by_compute(records):
        rows = [r for r in records if r["preset"] == preset and r["task"] == task]
        model = sweep_config(rows[0]["config"])["model"]
        seconds = [r["run_seconds"] for r in rows if r["run_seconds"] is not None]
        measured = f"{np.median(seconds):.0f} (median of {len(seconds)})" if seconds else "-"
        if len(seconds) < len(rows):
            measured += f"; {len(rows) - len(seconds)} resumed, not counted"
        lines.append(
            f"| {preset} | {task} | {model['dim']} x {model['depth']} | {rows[0]['steps']} "
            f"| {rows[0]['train_flops'] / 1e9:.4g} | {measured} |"
        )
    return "\n".join(lines) + "\n"


def rule_table(records: list[dict], mdi: dict[str, float]) -> str:
    lines = [
        f"| preset | task | MDI acc_all | seeds | train loss < {boolean_rules.FIT_LOSS:g} "
        f"| at the MDI (+-{100 * boolean_rules.MDI_BAND:g} pt) | both | rule |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for preset, task in by_compute(records):
        rows = [r for r in records if r["preset"] == preset and r["task"] == task and r["method"] == "vanilla"]
        if not rows:
            continue
        v = boolean_rules.vanilla_rule(rows, mdi[task])
        n = v["seeds"]
        lines.append(
            f"| {preset} | {task} | {100 * mdi[task]:.2f} | {n} | {v['fit']}/{n} | {v['at_mdi']}/{n} | {v['both']}/{n} "
            f"| {'passes' if v['passes'] else 'fails'} |"
        )
    return "\n".join(lines) + "\n"


def unseen_table(records: list[dict], reference: list[dict], target_unseen: dict[str, float]) -> str:
    mdi_unseen = {r["task"]: r["unseen_mean_prediction"] for r in reference}
    lines = [
        "| preset | task | method | seeds | unseen mean prediction | MDI's | target's |",
        "|---|---|---|---|---|---|---|",
    ]
    groups = dict.fromkeys(tuple(r[k] for k in GROUP) for r in records)
    for preset, task, method in sorted(groups, key=lambda g: (g[1], g[0], g[2])):
        values = [
            r["unseen_mean_prediction"]
            for r in records
            if (r["preset"], r["task"], r["method"]) == (preset, task, method) and "unseen_mean_prediction" in r
        ]
        lines.append(
            f"| {preset} | {task} | {method} | {len(values)} | {tables.mean_std(values) if values else '-'} "
            f"| {mdi_unseen[task]:.4g} | {target_unseen[task]:.4g} |"
        )
    return "\n".join(lines) + "\n"


def plot_scale(records: list[dict], reference: list[dict], target_unseen: dict[str, float], path: Path) -> None:
    """Per task, acc_all (top) and the unseen mean prediction (bottom) against training FLOPs per run:
    the mean over seeds per method, every seed a dot; the MDI dashed, the target's unseen mean dotted."""
    tasks = list(dict.fromkeys(r["task"] for r in sorted(records, key=lambda r: r["task"])))
    methods = list(dict.fromkeys(r["method"] for r in records))
    mdi = {r["task"]: r for r in reference}
    fig, axes = plots.figure(2, len(tasks), 3.6, 3.0)
    for column, task in enumerate(tasks):
        for row, key in enumerate(("acc_all", "unseen_mean_prediction")):
            ax = axes[row][column]
            scale = 100.0 if key == "acc_all" else 1.0
            for method in methods:
                rows = [r for r in records if r["task"] == task and r["method"] == method and key in r]
                xs = sorted({r["train_flops"] for r in rows})
                if not xs:
                    continue
                means = [scale * np.mean([r[key] for r in rows if r["train_flops"] == x]) for x in xs]
                (line,) = ax.plot(xs, means, marker="o", label=method)
                ax.scatter(
                    [r["train_flops"] for r in rows],
                    [scale * r[key] for r in rows],
                    s=8,
                    alpha=0.4,
                    color=line.get_color(),
                )
            ax.axhline(scale * mdi[task][key], ls="--", color="gray", label="MDI")
            if key == "unseen_mean_prediction":
                ax.axhline(target_unseen[task], ls=":", color="k", label="target")
            ax.set_xscale("log")
            ax.xaxis.set_minor_formatter(NullFormatter())  # a decade or less wide: minor labels would collide
            ax.set_xlabel("training FLOPs per run")
            ax.set_ylabel("acc_all (%)" if key == "acc_all" else "unseen mean prediction")
            ax.set_title(task)
    axes[1][0].legend(fontsize=7)
    fig.tight_layout()
    plots.save_figure(fig, path)


def ordered(records: list[dict]) -> tuple[list[dict], list[dict]]:
    """The records by task, compute, method (in order of appearance) and seed, and the MDI's record per task."""
    order = {m: i for i, m in enumerate(dict.fromkeys(r["method"] for r in records))}
    records = sorted(records, key=lambda r: (r["task"], r["train_flops"], order[r["method"]], r["seed"]))
    return records, [study.mdi_record(get_task(t)) for t in dict.fromkeys(r["task"] for r in records)]


def scale_tables(records: list[dict]) -> dict[str, str]:
    """Every table of summary.md, by name (the page kinds `scale-NAME` of `experiments.audit`)."""
    records, reference = ordered(records)
    mdi = {r["task"]: r["acc_all"] for r in reference}
    target_unseen = {r["task"]: unseen_target_mean(r["task"]) for r in reference}
    return {
        "cost": cost_table(records),
        "rule": rule_table(records, mdi),
        "summary": tables.summary_table(reference + records, study.KEYS, GROUP),
        "count": tables.count_table(records, reference, GROUP),
        "unseen": unseen_table(records, reference, target_unseen),
    }


def page_kind(name: str):
    """A results page's table `scale-NAME` from the records of the folders it names."""

    def make(records: list[dict], params: dict[str, str], folder: Path) -> str:
        return scale_tables([with_scale(r, Path(r["source"])) for r in records])[name]

    return make, ()


PAGE_KINDS = {f"scale-{name}": page_kind(name) for name in ("cost", "rule", "summary", "count", "unseen")}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = store.ensure_writable_dir(args.out)
    methods = set(args.methods.split(",")) if args.methods else None
    records, sources = read_folders(args.dirs, methods)
    records, reference = ordered(records)
    target_unseen = {r["task"]: unseen_target_mean(r["task"]) for r in reference}
    made = scale_tables(records)
    body = "\n".join(
        [
            "## Cost of a run\n\n" + made["cost"],
            "## The vanilla rule (docs/design.md, Presets)\n\n" + made["rule"],
            "## Every (preset, task, method)\n\n" + made["summary"],
            "Seeds that reach / exceed the task's MDI in acc_all:\n\n" + made["count"],
            "## Unseen mean prediction\n\n" + made["unseen"],
        ]
    )
    store.write_atomic(
        out / "summary.md", "# Boolean study across model sizes\n\nFrom:\n" + "\n".join(sources) + "\n\n" + body
    )
    plot_scale(records, reference, target_unseen, out / "scale.png")
    print(body, end="")
    print(f"written to {out}/ (summary.md, scale.png)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
