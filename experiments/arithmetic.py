"""Low-data arithmetic study: python -m experiments.arithmetic --seeds=8 --ops=add,mul --train-fractions=0.004,0.01,0.03

Every (op, training fraction, method) trains all its seeds as one vmapped batch, each seed on its own
random training subset, and is scored by greedy decoding on held-out pairs (exact-match sequence
accuracy and per-digit accuracy). Writes results.jsonl, summary.md, config.json, seq_acc.png and
mask_OP.png (the place-value prior of each op) to --out; results are rewritten atomically after every batch.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

from experiments.cli import (
    Parser,
    add_run_control,
    add_seeds,
    finite_float,
    fraction_list,
    name_list,
    positive_float,
    positive_int,
    progress,
    run_control,
    run_main,
)
from maskjax import overrides, plots, store, tables
from maskjax.methods import METHODS, get_method
from maskjax.runner import BatchSpec, run_sweep
from maskjax.studies import arithmetic as study
from maskjax.tasks.arithmetic import FORMATS, OPERAND_DIGITS, OPS

KEYS = ("seq_acc", "token_acc", "train_seq_acc", "train_loss")
GROUPS = ("op", "train_fraction", "method")


def parse_args(argv: list[str] | None):
    p = Parser(prog="python -m experiments.arithmetic", description=__doc__.splitlines()[0])
    add_seeds(p, 8)
    p.add_argument("--ops", type=name_list, default=["add", "mul"], help=f"comma list of {','.join(OPS)}")
    p.add_argument(
        "--train-fractions",
        type=fraction_list(include_one=False),
        default=[0.004, 0.01, 0.03],
        help="training fractions in (0, 1) (default 0.004,0.01,0.03)",
    )
    p.add_argument(
        "--methods",
        type=name_list,
        default=["vanilla", "mask"],
        help=f"comma list of {','.join(METHODS)} (default vanilla,mask)",
    )
    p.add_argument("--preset", default="quick", help=f"one of {','.join(study.PRESETS)} (default quick)")
    p.add_argument("--eval-size", type=positive_int, help="held-out pairs scored per seed (preset: 4096 quick)")
    p.add_argument("--steps", type=positive_int, help="training steps, overriding the preset's epochs")
    p.add_argument("--epochs", type=positive_int, help="epochs over each training subset (preset: 50)")
    p.add_argument("--learning-rate", type=positive_float, help="AdamW peak learning rate (preset: 1e-3)")
    p.add_argument("--answer-format", choices=FORMATS, help="answer digit order (default reversed: units first)")
    p.add_argument("--open", type=finite_float, dest="open_value", help="mask logit of open entries (preset: +5)")
    p.add_argument("--closed", type=finite_float, dest="closed_value", help="mask logit of closed entries (preset: -5)")
    p.add_argument(
        "--out", type=Path, default=Path("results/arithmetic"), help="output folder (default results/arithmetic)"
    )
    add_run_control(p)
    return p.parse_args(argv)


def resolve_config(args) -> study.ArithmeticConfig:
    config = study.get_preset(args.preset)
    fields = ("eval_size", "steps", "epochs", "learning_rate", "answer_format", "open_value", "closed_value")
    return overrides.apply(
        dataclasses.replace(config, **{k: v for k in fields if (v := getattr(args, k)) is not None}), args.set
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    config = resolve_config(args)
    tasks, methods = study.resolve(args.ops, args.methods, config.answer_format)
    seeds = args.seeds
    resolved = {
        "study": "arithmetic",
        "ops": args.ops,
        "train_fractions": args.train_fractions,
        "methods": args.methods,
        "seeds": seeds,
        **dataclasses.asdict(config),
    }
    out = args.out

    def batch(task, fraction: float, method) -> BatchSpec:
        def train(checkpoints, resume: bool) -> list[dict]:
            return study.run_batch(task, method, fraction, seeds, config, progress, checkpoints, resume)

        fields = {"op": task.op, "train_fraction": fraction, "method": method.name}
        return BatchSpec(f"{task.op}_{fraction:g}_{method.name}", fields, len(seeds), train)

    def plot(records: list[dict]) -> None:
        for task in tasks:
            if any(r["op"] == task.op for r in records):
                plot_mask(out / f"mask_{task.op}.png", task, config)
        plots.plot_curves(records, out / "seq_acc.png", x="train_fraction", y="seq_acc", panel="op", line="method")

    specs = [batch(t, f, m) for t in tasks for f in args.train_fractions for m in methods]
    records = run_sweep(out, resolved, specs, write_outputs, run_control(args), progress, plot)
    print(write_outputs(out, records), end="")
    print(f"results in {out}/ (results.jsonl, summary.md, config.json, seq_acc.png, mask_*.png)", file=sys.stderr)
    return 0


def plot_mask(path: Path, task, config: study.ArithmeticConfig) -> None:
    """The op's mask prior M: queries down, keys across, answer digits named by place (c0 = units); a row is
    the query that predicts the token after it."""
    places = range(OPERAND_DIGITS - 1, -1, -1)
    prompt = [f"a{p}" for p in places] + [task.op] + [f"b{p}" for p in places] + ["="]
    plots.plot_matrices(
        {f"{task.op}, {task.answer_format} answer: M": study.mask_logits(task, get_method("mask"), config)},
        path,
        [*prompt, *[f"c{p}" for p in task.answer_places()]],
        columns=1,
    )


def write_outputs(out: Path, records: list[dict]) -> str:
    store.write_jsonl(out / "results.jsonl", records)
    table = tables.summary_table(records, KEYS, GROUPS)
    seeds = tables.per_seed_table(records, "seq_acc", GROUPS)
    store.write_atomic(out / "summary.md", f"# Low-data arithmetic study\n\n{table}\n{seeds}")
    return table


if __name__ == "__main__":
    sys.exit(run_main(main))
