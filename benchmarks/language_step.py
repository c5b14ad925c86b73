"""Train-step speed of the language study, to size its runs: python -m benchmarks.language_step [--preset=quick]

For each method and number of seeds S, the batch of S runs trains as one vmapped, jitted program (the
study's own `make_batch` and `compile_program`) on random token windows: a step's cost does not depend
on the text. Prints seconds per step and what the preset's steps cost per batch in minutes. Measures,
never asserts.
"""

from __future__ import annotations

import sys

import jax
import numpy as np

from benchmarks.train_step import int_list, seconds_per_step
from experiments.cli import Parser, add_model_flags, name_list, positive_int, run_main, with_overrides
from maskjax.methods import get_method
from maskjax.studies import language as study
from maskjax.train import compile_program, shard_runs


def main(argv: list[str] | None = None) -> int:
    p = Parser(prog="python -m benchmarks.language_step", description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="quick", help="paper, quick or test (default quick)")
    p.add_argument("--seeds", type=int_list, default=[1, 4], help="batch sizes in runs (default 1,4)")
    p.add_argument("--methods", type=name_list, default=["vanilla", "mask"], help="default vanilla,mask")
    p.add_argument("--context", type=positive_int, help="override the preset's context")
    p.add_argument("--vocab-size", type=positive_int, help="override the preset's vocabulary size")
    p.add_argument("--batch-size", type=positive_int, help="override the preset's batch size")
    add_model_flags(p, "override model")
    p.add_argument("--steps", type=positive_int, default=10, help="steps per timed chunk (default 10)")
    p.add_argument("--repeats", type=positive_int, default=3, help="timed chunks; the best is kept (default 3)")
    args = p.parse_args(argv)
    config = with_overrides(study.get_preset(args.preset), args, ("context", "vocab_size", "batch_size"))
    windows = np.random.default_rng(0).integers(0, config.vocab_size, (512, config.context + 1)).astype(np.int32)
    weights = np.ones((512, config.context), np.float32)
    data = study.LanguageData("random", "none", config.vocab_size, windows, windows, weights, windows, weights, 1)
    print(
        f"{args.preset}: {config.model}, context {config.context}, vocab {config.vocab_size}, "
        f"batch {config.batch_size}, {jax.devices()}"
    )
    print("| method | seeds | s/step | min per batch of the preset's steps |")
    print("|---|---|---|---|")
    for name in args.methods:
        method = get_method(name)
        for seeds in args.seeds:
            batch = study.make_batch(data, method, list(range(seeds)), config)
            program = compile_program(batch.init_run, batch.loss, len(windows), batch.train_config)
            state = program.init(*shard_runs((batch.run_keys, batch.run_masks)))
            best = seconds_per_step(
                program.chunk, state, batch.data, min(args.steps, batch.train_config.chunk_steps), args.repeats
            )
            print(f"| {name} | {seeds} | {best:.4f} | {config.steps * best / 60:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
