"""The floor a ViT should clear: python -m experiments.vision_linear --dataset=fashion_mnist --train-fraction=0.05,1

A softmax regression on the raw pixels, fitted by L-BFGS on exactly the class-balanced subsets the vision
study trains each seed on (`maskjax.tasks.vision.balanced_subset`), scored on the test set. Prints one
row per fraction and seed and the mean; with --out writes results.jsonl (with config, commit, JAX version
and devices) and summary.md (the same tables) there.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from maskjax import store
from maskjax.cli.driver import Parser, add_seeds, fraction_list, progress, run_main
from maskjax.data import images
from maskjax.tasks import vision as vt


def main(argv: list[str] | None = None) -> int:
    p = Parser(prog="python -m experiments.vision_linear", description=__doc__.splitlines()[0])
    p.add_argument("--dataset", default="fashion_mnist", choices=images.DATASETS)
    p.add_argument("--data-dir", help="folder holding the dataset's files (see README)")
    p.add_argument("--train-fraction", type=fraction_list(include_one=True), default=[1.0], help="comma list")
    add_seeds(p, 4)
    p.add_argument("--out", type=Path, help="folder for results.jsonl (default: print only)")
    args = p.parse_args(argv)
    if args.out is not None:
        store.ensure_writable_dir(args.out)
    data = images.load(args.dataset, args.data_dir)
    config = {"study": "vision_linear", "dataset": args.dataset, "train_fractions": args.train_fraction,
              "seeds": args.seeds, "model": "softmax regression on raw pixels, L-BFGS 200 steps, l2 1e-4"}
    records = []
    rows = ["| dataset | train_fraction | seed | images | test_acc (%) | train_loss |", "|---|---|---|---|---|---|"]
    print("\n".join(rows))
    for fraction in args.train_fraction:
        for seed in args.seeds if fraction < 1 else args.seeds[:1]:
            subset = vt.balanced_subset(data.train_labels, fraction, seed)
            progress(f"{args.dataset} {fraction:g} seed {seed}: fitting on {len(subset)} images")
            acc, loss = vt.softmax_regression_accuracy(
                data.train_images[subset], data.train_labels[subset], data.test_images, data.test_labels,
                data.num_classes,
            )
            records.append({"dataset": args.dataset, "train_fraction": fraction, "seed": seed, "images": len(subset),
                            "method": "linear", "test_acc": acc, "train_loss": loss, "config": config})
            rows.append(f"| {args.dataset} | {fraction:g} | {seed} | {len(subset)} | {100 * acc:.2f} | {loss:.4g} |")
            print(rows[-1])
    means = []
    for fraction in args.train_fraction:
        accs = [r["test_acc"] for r in records if r["train_fraction"] == fraction]
        means.append(f"{args.dataset} {fraction:g}: test_acc {100 * np.mean(accs):.2f} +- {100 * np.std(accs):.2f} "
                     f"over {len(accs)} subset(s)")
    print("\n".join(means))
    if args.out is not None:
        meta = store.environment()
        store.write_jsonl(args.out / "results.jsonl", [{**r, **meta} for r in records])
        store.write_atomic(args.out / "summary.md", "\n".join(
            ["# Softmax regression on raw pixels", "", *rows, "", *(f"- {m}" for m in means), ""]))
        print(f"results in {args.out}/results.jsonl and summary.md")
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
