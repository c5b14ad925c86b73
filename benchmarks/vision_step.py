"""Train-step speed of the vision study, to size its runs: python -m benchmarks.vision_step [--preset=quick]

For each method and number of seeds S, the batch of S runs trains as one vmapped, jitted program (the
study's own `make_batch` and `compile_program`, augmentation included). Prints seconds per step, the
steps one run takes at each training fraction, and what a batch of S seeds would cost in minutes.
Measures, never asserts.
"""

from __future__ import annotations

import sys

import jax

from benchmarks.train_step import int_list, seconds_per_step
from experiments.cli import Parser, fraction_list, name_list, positive_int, run_main
from maskjax.data import images
from maskjax.methods import get_method
from maskjax.studies import vision as study
from maskjax.train import compile_program, shard_runs


def main(argv: list[str] | None = None) -> int:
    p = Parser(prog="python -m benchmarks.vision_step", description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="quick", help="paper, quick or test (default quick)")
    p.add_argument("--dataset", default="fashion_mnist", choices=images.DATASETS)
    p.add_argument("--data-dir", help="folder holding the dataset's files")
    p.add_argument("--seeds", type=int_list, default=[1, 4], help="batch sizes in runs (default 1,4)")
    p.add_argument("--methods", type=name_list, default=["vanilla", "mask"], help="default vanilla,mask")
    p.add_argument("--fractions", type=fraction_list(include_one=True), default=[0.1, 1.0])
    p.add_argument("--steps", type=positive_int, default=20, help="steps per timed chunk (default 20)")
    p.add_argument("--repeats", type=positive_int, default=3, help="timed chunks; the best is kept (default 3)")
    args = p.parse_args(argv)
    config = study.get_preset(args.preset)
    data = images.load(args.dataset, args.data_dir)
    print(f"{args.dataset} {args.preset}: {config.model}, patch {config.patch_size}, {jax.devices()}")
    print("| method | seeds | s/step | " + " | ".join(f"min per batch at {f:g}" for f in args.fractions) + " |")
    print("|---|---|---|" + "---|" * len(args.fractions))
    for name in args.methods:
        method = get_method(name)
        for seeds in args.seeds:
            batch = study.make_batch(data, method, 1.0, list(range(seeds)), config)
            n_train = batch.data[1].shape[-1]
            program = compile_program(batch.init_run, batch.loss, n_train, batch.train_config, augment=batch.augment)
            state = program.init(*shard_runs((batch.run_keys, batch.run_masks)))
            best = seconds_per_step(
                program.chunk, state, batch.data, min(args.steps, batch.train_config.chunk_steps), args.repeats
            )
            minutes = [config.train_config(round(f * len(data.train_labels))).steps * best / 60 for f in args.fractions]
            print(f"| {name} | {seeds} | {best:.4f} | " + " | ".join(f"{m:.1f}" for m in minutes) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
