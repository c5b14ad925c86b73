"""Boolean generalisation-on-the-unseen study: python -m experiments.boolean --seeds=8

Every (task, method) pair trains all its seeds as one vmapped batch. Writes results.jsonl
(one record per task, method and seed), summary.md (mean +- std, with the MDI's own scores),
config.json and PNG plots to --out; results are rewritten atomically after every batch.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import numpy as np

from experiments.cli import (
    Parser,
    add_run_control,
    add_seeds,
    finite_float,
    name_list,
    non_negative_float,
    positive_float,
    positive_int,
    progress,
    run_control,
    run_main,
)
from maskjax import overrides, plots, priors, store, tables
from maskjax.errors import ConfigError
from maskjax.methods import METHODS
from maskjax.runner import BatchSpec, run_sweep
from maskjax.studies import boolean as study
from maskjax.tasks.boolean import TASKS
from maskjax.train import OPTIMIZERS

MODEL_FLAGS = ("dim", "depth", "heads", "head_dim", "mlp_dim", "dtype")
GRADIENT_KEYS = ("grad_norm_mask", "grad_norm_qk")
CHANGE_KEYS = ("mask_change_open_mean", "mask_change_closed_mean", "mask_change_closed_max")
KEYS = ("acc_all", "acc_unseen", "mse", "unseen_mean_prediction", "train_loss")


def add_config_flags(p: Parser, mask_values: bool = True, run_control: bool = True) -> None:
    """The flags that override a BooleanConfig preset; shared by every Boolean CLI."""
    add_seeds(p, 8)
    p.add_argument("--preset", default="quick", help=f"one of {','.join(study.PRESETS)} (default quick)")
    p.add_argument("--steps", type=positive_int, help="training steps, overriding the preset's epochs")
    p.add_argument("--learning-rate", type=positive_float, help="one learning rate for every task")
    p.add_argument("--dim", type=positive_int, help="model width")
    p.add_argument("--depth", type=positive_int, help="number of blocks")
    p.add_argument("--heads", type=positive_int, help="attention heads")
    p.add_argument("--head-dim", type=positive_int, help="width of each head")
    p.add_argument("--mlp-dim", type=positive_int, help="MLP hidden width")
    p.add_argument(
        "--dtype",
        choices=("float32", "bfloat16"),
        help="matmul dtype (default float32; bfloat16 for accelerators, parameters and optimizer stay float32)",
    )
    p.add_argument("--row-policy", help=f"mask rows outside the groups: {', '.join(priors.ROW_POLICIES)}")
    p.add_argument(
        "--optimizer",
        choices=OPTIMIZERS,
        help="adam: Adam with L2 decay added to the gradient, the paper's (default); adamw: decoupled decay; "
        "sgd: momentum 0.9 with L2 decay (give it its own --learning-rate)",
    )
    p.add_argument(
        "--mask-weight-decay",
        type=non_negative_float,
        help="weight decay of the mask logits (default: the same as every other parameter's); 0 exempts them",
    )
    if mask_values:
        p.add_argument("--open", type=finite_float, dest="open_value", help="mask logit of open entries (+10)")
        p.add_argument("--closed", type=finite_float, dest="closed_value", help="mask logit of closed entries (-10)")
    if run_control:
        add_run_control(p)


def parse_args(argv: list[str] | None):
    p = Parser(prog="python -m experiments.boolean", description=__doc__.splitlines()[0])
    p.add_argument(
        "--tasks", type=name_list, default=["2parity"], help=f"comma list of {','.join(TASKS)} (default 2parity)"
    )
    p.add_argument(
        "--methods",
        type=name_list,
        default=["vanilla", "mask", "mask_fixed", "mask_zero"],
        help=f"comma list of {','.join(METHODS)} (default vanilla,mask,mask_fixed,mask_zero)",
    )
    p.add_argument("--out", type=Path, default=Path("results/boolean"), help="output folder (default results/boolean)")
    add_config_flags(p)
    return p.parse_args(argv)


def resolve_config(args) -> study.BooleanConfig:
    config = study.get_preset(args.preset)
    model = dataclasses.replace(
        config.model,
        **{k: v for k in MODEL_FLAGS if (v := getattr(args, k)) is not None},
    )
    schedules = config.schedules
    if args.learning_rate is not None:
        schedules = {task: (args.learning_rate, epochs) for task, (_, epochs) in schedules.items()}
    fields = {
        k: v
        for k in ("steps", "row_policy", "open_value", "closed_value", "optimizer", "mask_weight_decay")
        if (v := getattr(args, k, None)) is not None
    }
    config = overrides.apply(
        dataclasses.replace(config, model=model, schedules=schedules, **fields), getattr(args, "set", [])
    )
    if config.row_policy not in priors.ROW_POLICIES:
        raise ConfigError(f"unknown row policy {config.row_policy!r}; known: {', '.join(priors.ROW_POLICIES)}")
    return config


SEED_KEYS = ("acc_all", "unseen_mean_prediction")


def summary_markdown(records: list[dict], reference: list[dict], group_by: tuple[str, ...] = ("task", "method")) -> str:
    """Mean +- std per group (beside the MDI's own scores), the seeds above the MDI per group with
    Fisher's exact test against vanilla, and per-seed tables: the body of every Boolean summary.md."""
    parts = [
        tables.summary_table(reference + records, KEYS, group_by),
        "Seeds that reach / exceed the task's MDI in acc_all:\n\n" + tables.count_table(records, reference, group_by),
        *[tables.per_seed_table(records, key, group_by) for key in SEED_KEYS],
    ]
    return "\n".join(parts)


def write_outputs(out: Path, records: list[dict], reference: list[dict]) -> str:
    store.write_jsonl(out / "results.jsonl", records)
    table = tables.summary_table(reference + records, KEYS, ("task", "method"))
    store.write_atomic(out / "summary.md", "# Boolean GOTU study\n\n" + summary_markdown(records, reference))
    return table


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    config = resolve_config(args)
    tasks, methods = study.resolve(args.tasks, args.methods, config)
    seeds = args.seeds
    resolved = {
        "study": "boolean",
        "tasks": args.tasks,
        "methods": args.methods,
        "seeds": seeds,
        **dataclasses.asdict(config),
        "steps": {t.name: config.train_config(t).steps for t in tasks},
        "train": {t.name: dataclasses.asdict(config.train_config(t)) for t in tasks},
    }
    out = args.out
    reference = [study.mdi_record(t) for t in tasks]

    def batch(task, method) -> BatchSpec:
        def train(checkpoints, resume: bool) -> list[dict]:
            records, maps = study.run_batch(task, method, seeds, config, progress, checkpoints, resume)
            store.write_maps(out / "maps" / f"{task.name}_{method.name}.npz", maps)
            return records

        return BatchSpec(f"{task.name}_{method.name}", {"task": task.name, "method": method.name}, len(seeds), train)

    def plot(records: list[dict]) -> None:
        for task in tasks:
            task_records = [r for r in records if r.get("task") == task.name]
            if not task_records:
                continue
            trained = dict.fromkeys(r["method"] for r in task_records)
            maps = {m: store.read_maps(out / "maps" / f"{task.name}_{m}.npz") for m in trained}
            plot_task(out, task, config, maps)
            plot_probes(out, task.name, task_records)
        done = {r["task"] for r in records}
        plots.plot_accuracy([r for r in reference if r["task"] in done] + records, out / "accuracy.png")

    specs = [batch(task, method) for task in tasks for method in methods]
    records = run_sweep(
        out, resolved, specs, lambda o, r: write_outputs(o, r, reference), run_control(args), progress, plot
    )
    print(write_outputs(out, records, reference), end="")
    print(f"results in {out}/ (results.jsonl, summary.md, config.json, *.png)", file=sys.stderr)
    return 0


def plot_probes(out: Path, task_name: str, task_records: list[dict]) -> None:
    """loss_TASK.png, drift_TASK.png, gradients_TASK.png and, when a mask was trained, mask_change_TASK.png."""
    plots.plot_loss(task_records, out / f"loss_{task_name}.png")
    plots.plot_drift(task_records, out / f"drift_{task_name}.png")
    plots.plot_drift(task_records, out / f"gradients_{task_name}.png", GRADIENT_KEYS, log=True)
    if any("mask_change_open_mean" in r for r in task_records):
        plots.plot_drift(task_records, out / f"mask_change_{task_name}.png", CHANGE_KEYS, log=True)


def plot_task(out: Path, task, config: study.BooleanConfig, maps: dict[str, dict[str, np.ndarray]]) -> None:
    """The prior, then per method (seed 0) the layer-0 attention at init and after training (cf. the paper's Fig. 5)."""
    labels = ["CLS", *[f"x{i}" for i in range(task.n_bits)]]
    panels = {
        f"prior: open entries ({config.row_policy})": study.oracle_pattern(task, config).astype(float),
        "target: softmax(log_sigmoid(M))": study.oracle_target(task, config),
    }
    for name, attention in maps.items():
        panels[f"{name} layer 0, init"] = attention["init"][0]
        panels[f"{name} layer 0, trained"] = attention["final"][0]
    plots.plot_matrices(panels, out / f"attention_{task.name}.png", labels)


if __name__ == "__main__":
    sys.exit(run_main(main))
