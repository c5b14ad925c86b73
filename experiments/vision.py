"""ViT study: python -m experiments.vision --dataset=fashion_mnist --seeds=4 --methods=vanilla,mask,mimetic,impulse

Every (dataset, training fraction, method) trains all its seeds as one vmapped batch. Writes
results.jsonl (test accuracy and loss, the mask's persistence and the attention drift per layer,
curves), summary.md (mean +- std, per seed, the mask against every other method paired by seed),
config.json and plots: curves_*.png, attention_*.png (the first test image) and mask_*.png (the
learned mask of every layer) to --out; results are rewritten atomically after every batch.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import numpy as np

from experiments.cli import (
    Parser,
    add_model_flags,
    add_run_control,
    add_seeds,
    finite_float,
    fraction_list,
    name_list,
    non_negative_float,
    positive_float,
    positive_int,
    progress,
    run_control,
    run_main,
    with_overrides,
)
from maskjax import plots, store, tables
from maskjax.data import images
from maskjax.errors import ConfigError
from maskjax.runner import BatchSpec, run_sweep
from maskjax.studies import vision as study

KEYS = ("test_acc", "test_loss", "train_loss", "pattern_error_init")
GROUPS = ("dataset", "train_fraction", "method")
CURVE_KEYS = ("test_acc_probe", "test_loss_probe")
PERSISTENCE_KEYS = ("attention_drift", "mask_change_mean", "mask_sign_kept")


def non_negative_int(text: str) -> int:
    value = non_negative_float(text)
    if value != int(value):
        raise ConfigError(f"expected a whole number >= 0, got {text!r}")
    return int(value)


def parse_args(argv: list[str] | None):
    p = Parser(prog="python -m experiments.vision", description=__doc__.splitlines()[0])
    p.add_argument("--dataset", default="fashion_mnist", choices=images.DATASETS, help="default fashion_mnist")
    p.add_argument("--data-dir", type=Path, help="folder holding the dataset's files (see README)")
    p.add_argument("--image-size", type=positive_int, help="resolution ImageNet-100 is read at (default 64)")
    add_seeds(p, 4)
    p.add_argument(
        "--methods",
        type=name_list,
        default=["vanilla", "mask", "mimetic", "impulse"],
        help=f"comma list of {','.join(study.METHODS)} (default vanilla,mask,mimetic,impulse)",
    )
    p.add_argument(
        "--train-fraction",
        type=fraction_list(include_one=True),
        default=[1.0],
        help="class-balanced training fractions in (0, 1], a comma list (default 1)",
    )
    p.add_argument("--preset", default="quick", help=f"one of {','.join(study.PRESETS)} (default quick)")
    p.add_argument("--steps", type=positive_int, help="training steps, overriding the preset's epochs")
    p.add_argument("--epochs", type=positive_int, help="epochs over each training set")
    p.add_argument("--batch-size", type=positive_int, help="batch size")
    p.add_argument("--learning-rate", type=positive_float, help="AdamW peak learning rate")
    p.add_argument("--patch-size", type=positive_int, help="patch size (must divide the image size)")
    p.add_argument("--radius", type=non_negative_int, help="Chebyshev radius of the locality mask (preset: 1)")
    p.add_argument("--pool", choices=("gap", "cls"), help="global average pooling (default) or a CLS token")
    p.add_argument("--open", type=finite_float, dest="open_value", help="mask logit of open entries (preset +10)")
    p.add_argument("--closed", type=finite_float, dest="closed_value", help="mask logit of closed entries (preset -10)")
    add_model_flags(p)
    p.add_argument("--out", type=Path, default=Path("results/vision"), help="output folder (default results/vision)")
    add_run_control(p)
    return p.parse_args(argv)


def resolve_config(args) -> study.VisionConfig:
    fields = (
        "steps",
        "epochs",
        "batch_size",
        "learning_rate",
        "patch_size",
        "radius",
        "pool",
        "open_value",
        "closed_value",
    )
    return with_overrides(study.get_preset(args.preset), args, fields)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    config = resolve_config(args)
    methods = study.resolve(args.methods)
    seeds = args.seeds
    progress(f"reading {args.dataset}")
    data = images.load(args.dataset, args.data_dir, args.image_size)
    task = study.make_task(data, config)
    resolved = {
        "study": "vision",
        "dataset": args.dataset,
        "data_dir": str(args.data_dir) if args.data_dir else None,
        "train_fractions": args.train_fraction,
        "methods": args.methods,
        "seeds": seeds,
        **dataclasses.asdict(config),
    }
    out = args.out

    def maps_path(fraction: float, method: str) -> Path:
        return out / "maps" / f"{data.name}_{fraction:g}_{method}.npz"

    def batch(fraction: float, method) -> BatchSpec:
        def train(checkpoints, resume: bool) -> list[dict]:
            records, maps = study.run_batch(data, method, fraction, seeds, config, progress, checkpoints, resume)
            store.write_maps(maps_path(fraction, method.name), maps)
            return records

        fields = {"dataset": data.name, "train_fraction": fraction, "method": method.name}
        return BatchSpec(f"{data.name}_{fraction:g}_{method.name}", fields, len(seeds), train)

    def plot(records: list[dict]) -> None:
        for fraction in dict.fromkeys(r["train_fraction"] for r in records):
            name = f"{data.name}_{fraction:g}"
            done = [r for r in records if r["train_fraction"] == fraction]
            plot_curves(done, out / f"curves_{name}.png")
            plots.plot_drift(done, out / f"persistence_{name}.png", PERSISTENCE_KEYS)
            methods = dict.fromkeys(r["method"] for r in done)
            # A folder written before maps were kept has none for its older batches; those are left out.
            ours = {m: store.read_maps(maps_path(fraction, m)) for m in methods if maps_path(fraction, m).exists()}
            plot_attention(task, data.test_images[0], ours, out / f"attention_{name}.png")
            for method, maps in ours.items():
                if "mask_final" in maps:
                    plot_masks(task, maps, out / f"mask_{name}_{method}.png")

    specs = [batch(fraction, method) for fraction in args.train_fraction for method in methods]
    records = run_sweep(out, resolved, specs, write_outputs, run_control(args), progress, plot)
    print(write_outputs(out, records), end="")
    print(f"results in {out}/ (results.jsonl, summary.md, config.json, *.png)", file=sys.stderr)
    return 0


def write_outputs(out: Path, records: list[dict]) -> str:
    store.write_jsonl(out / "results.jsonl", records)
    table = tables.summary_table(records, KEYS, GROUPS)
    parts = [
        table,
        tables.paired_table(records, "test_acc", "mask", ("dataset", "train_fraction")),
        tables.per_seed_table(records, "test_acc", GROUPS),
    ]
    store.write_atomic(out / "summary.md", "# Vision study\n\n" + "\n".join(parts))
    return table


def plot_curves(records: list[dict], path: Path) -> None:
    """Test accuracy and loss on the probe subset against step, per method (mean over seeds, range shaded)."""
    plots.plot_step_curves(records, path, CURVE_KEYS)


def centre_query(task, matrix_NN: np.ndarray) -> np.ndarray:
    """The row of the patch nearest the grid's centre, reshaped on the grid [grid, grid]."""
    offset = int(task.cls)
    centre = (task.grid // 2) * task.grid + task.grid // 2 + offset
    return np.asarray(matrix_NN)[centre, offset:].reshape(task.grid, task.grid)


def plot_attention(task, image: np.ndarray, per_method: dict[str, dict], path: Path) -> None:
    """The first test image, then per method (seed 0, trained) the centre patch's attention on the grid in
    the first and the last layer, mean over heads."""
    panels = {"first test image": np.asarray(image, np.float64).mean(-1)}
    for method, maps in per_method.items():
        attention = maps["attention"]
        panels[f"{method}: layer 0"] = centre_query(task, attention[0].mean(0))
        panels[f"{method}: layer {len(attention) - 1}"] = centre_query(task, attention[-1].mean(0))
    plots.plot_matrices(panels, path, columns=3)


def plot_masks(task, maps: dict[str, np.ndarray], path: Path) -> None:
    """Per layer, the learned M after training (mean over heads): the centre patch's row on the grid and
    the whole matrix; the initial M's row first, for reference."""
    panels = {"init: centre patch": centre_query(task, maps["mask_init"][0].mean(0))}
    for layer, mask in enumerate(maps["mask_final"]):
        panels[f"layer {layer}: centre patch"] = centre_query(task, mask.mean(0))
        panels[f"layer {layer}: M"] = mask.mean(0)
    plots.plot_matrices(panels, path, columns=3)


if __name__ == "__main__":
    sys.exit(run_main(main))
