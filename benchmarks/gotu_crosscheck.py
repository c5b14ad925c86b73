"""The mask on 2Parity in PyTorch: python -m benchmarks.gotu_crosscheck [--seeds=4] [--dim=32] [--depth=2] [--out=DIR]

Trains the GOTU reference transformer in PyTorch (`benchmarks.torch_gotu`) on 2Parity's seen region, per
method (vanilla, mask, mask_fixed by default) and seed, with the paper's optimizer (Adam, L2 weight decay,
batch 256, MSE) and the learning rate and epochs of a maskjax Boolean preset (quick by default), so a
mask that fails in maskjax can be seen to fail, or not, outside JAX. Every function of (x0, x1) that fits the
three seen corners is (t - 1) + (1 - t)(x0 + x1) + t x0 x1 and predicts 4t - 3 on the unseen corner, so
the table gives t, the x0 x1 coefficient of the model's mean prediction per corner: the sign on the unseen
corner is right only when t > 0.75. Prints a table per method and seed, a summary per method, then one
JSON line; --out writes results.jsonl and summary.md. Needs the `bench` extra (torch).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import torch_gotu
from maskjax import runs, store, tables
from maskjax.cli.driver import (
    Parser,
    add_field_flags,
    add_seeds,
    given,
    name_list,
    positive_float,
    positive_int,
    progress,
    run_main,
)
from maskjax.errors import ConfigError
from maskjax.methods import Method
from maskjax.models.layers import ModelConfig
from maskjax.studies import boolean
from maskjax.tasks.boolean import BooleanTask, cube, get_task, pair_coefficient, scores
from maskjax.train import TrainConfig

TASK = "2parity"
METHODS = ("vanilla", "mask", "mask_fixed")
EVAL_BATCH = 4096
PER_SEED_KEYS = ("acc_all", "acc_unseen", "train_loss", "pair_coefficient", "unseen_from_t", "unseen_mean_prediction")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = Parser(prog="python -m benchmarks.gotu_crosscheck", description=__doc__.splitlines()[0])
    add_seeds(p, 4)
    p.add_argument("--methods", type=name_list, default=list(METHODS), help=f"default {','.join(METHODS)}")
    p.add_argument("--preset", default="quick", help="Boolean preset giving the defaults below (default quick)")
    add_field_flags(p, ModelConfig, "model", "model (default: the preset's)", exclude=("dtype",))
    p.add_argument(
        "--learning-rate",
        type=positive_float,
        help="Adam's (default: the preset's 2Parity rate x preset width / --dim, the 1/width rule it is scaled by)",
    )
    p.add_argument("--epochs", type=positive_int, help="default: the preset's 2Parity epochs")
    p.add_argument(
        "--init",
        choices=("torch", "maskjax"),
        default="torch",
        help="torch: PyTorch's own initialisation from the seed; maskjax: the maskjax study's initial "
        "parameters of that seed, copied in (default torch)",
    )
    p.add_argument("--out", type=Path, help="folder for results.jsonl and summary.md")
    return p.parse_args(argv)


def crosscheck_config(args: argparse.Namespace) -> boolean.BooleanConfig:
    """The preset with the model flags, and its 2Parity schedule at the chosen width; --epochs replaces a
    preset's fixed step count."""
    config = boolean.STUDY.preset(args.preset)
    model = dataclasses.replace(config.model, **{path[0]: v for path, v in given(args, "model").items()})
    learning_rate, epochs = config.schedules[TASK]
    schedule = (args.learning_rate or learning_rate * config.model.dim / model.dim, args.epochs or epochs)
    steps = None if args.epochs else config.steps
    return dataclasses.replace(config, model=model, schedules={TASK: schedule}, steps=steps)


def check_method(method: Method, init: str) -> None:
    """Refuse what the PyTorch model cannot hold: QK-LayerNorm, and a QK prior unless maskjax initialises it."""
    if method.qk_norm:
        raise ConfigError(f"method {method.name!r} uses QK-LayerNorm, which the PyTorch model does not have")
    if method.qk_init != "default" and init != "maskjax":
        raise ConfigError(f"method {method.name!r} starts from a QK prior, which only --init=maskjax copies in")


def build_model(task: BooleanTask, method: Method, config: boolean.BooleanConfig, seed: int, init: str) -> Any:
    """The method's PyTorch model for one seed: its mask from the study's own patterns and values, its other
    parameters from torch's seed (the reference code's own initialisation) or copied from the maskjax study's
    initial state of that seed."""
    import torch

    m = config.model
    mask = boolean.task_mask_logits(task, method, config, seed) if method.mask_mode != "none" else None
    torch.manual_seed(seed)
    model = torch_gotu.gotu_model(
        task.n_bits, m.dim, m.depth, m.heads, m.head_dim, m.mlp_dim, mask, method.mask_mode == "learnable"
    )
    if init == "maskjax":
        inputs = boolean.make_group(boolean.BooleanGroup(task, method), [seed], config).inputs
        params, constants = inputs.init_run(inputs.run_keys[0], *(a[0] for a in inputs.run_inputs))
        torch_gotu.load_flax_params(model, {"params": params, "constants": constants}, m.depth)
    return model


def train(
    model: Any, x: np.ndarray, y: np.ndarray, train_config: TrainConfig, seed: int, log: Callable[[str], None]
) -> np.ndarray:
    """Adam with L2 weight decay on MSE, as the reference trains: a fresh shuffle of the training set every
    epoch (the last partial batch dropped, as maskjax does; 2Parity has none). Returns the loss per step."""
    import torch

    optimizer = torch.optim.Adam(
        model.parameters(), lr=train_config.learning_rate, weight_decay=train_config.weight_decay
    )
    x_t, y_t = torch.from_numpy(x), torch.from_numpy(y)
    per_epoch = len(x) // train_config.batch_size
    generator = torch.Generator().manual_seed(seed)
    losses = np.empty(train_config.steps)
    started = time.perf_counter()
    for step in range(train_config.steps):
        epoch, index = divmod(step, per_epoch)
        if index == 0:
            order = torch.randperm(len(x), generator=generator)
        rows = order[index * train_config.batch_size : (index + 1) * train_config.batch_size]
        loss = torch.mean((model(x_t[rows]) - y_t[rows]) ** 2)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses[step] = loss.item()
        if index == per_epoch - 1 or step == train_config.steps - 1:
            per_step = (time.perf_counter() - started) / (step + 1)
            log(
                f"epoch {epoch + 1}, step {step + 1}/{train_config.steps}: loss {losses[step]:.3g}, "
                f"{1e3 * per_step:.2f} ms/step, ETA {per_step * (train_config.steps - step - 1):.0f} s"
            )
    return losses


def predict(model: Any, x: np.ndarray) -> np.ndarray:
    """Predictions on x, float64, in batches of EVAL_BATCH."""
    import torch

    with torch.no_grad():
        return np.concatenate([model(chunk).numpy() for chunk in torch.from_numpy(x).split(EVAL_BATCH)]).astype(
            np.float64
        )


def corner_fit(points: np.ndarray, pred: np.ndarray) -> dict[str, float]:
    """t, the x0 x1 coefficient of the prediction on the whole cube (`tasks.boolean.pair_coefficient`, the
    field every maskjax 2Parity record holds); with the seen corners fitted, the unseen corner (-1, -1) gets
    4t - 3 (`unseen_from_t`), beside the mean it does get."""
    t = pair_coefficient(pred, (0, 1))
    unseen = pred[(points[:, 0] == -1) & (points[:, 1] == -1)].mean()
    return {"pair_coefficient": t, "unseen_from_t": 4 * t - 3, "unseen_mean_prediction": float(unseen)}


def run(task: BooleanTask, method: Method, seed: int, config: boolean.BooleanConfig, init: str) -> dict:
    """Train one (method, seed) and score it on the whole cube."""
    label = f"{task.name} {method.name} seed {seed}"
    points = cube(task.n_bits).astype(np.float32)
    seen = np.asarray(task.seen(points), bool)
    target = np.asarray(task.target(points), np.float32)
    train_config = config.train_config(task)
    progress(f"{label}: training")
    started = time.perf_counter()
    model = build_model(task, method, config, seed, init)
    log = lambda message: progress(f"{label}: {message}")  # noqa: E731
    losses = train(model, points[seen], target[seen], train_config, seed, log)
    seconds = time.perf_counter() - started
    pred = predict(model, points)
    diverged = not (np.all(np.isfinite(losses)) and np.all(np.isfinite(pred)))
    metrics = dict.fromkeys(PER_SEED_KEYS) if diverged else {**scores(task, pred), **corner_fit(points, pred)}
    return {
        "task": task.name,
        "method": method.name,
        "seed": seed,
        **metrics,
        "train_loss": None if diverged else runs.end_loss(losses),
        "diverged": diverged,
        "init": init,
        "preset": config.preset,
        "model": dataclasses.asdict(config.model),
        "learning_rate": train_config.learning_rate,
        "weight_decay": train_config.weight_decay,
        "batch_size": train_config.batch_size,
        "steps": train_config.steps,
        "seconds": round(seconds, 2),
        "torch_version": torch_gotu.version(),
    }


def per_seed_table(records: list[dict]) -> str:
    """One row per method and seed: accuracies in percent, t and the unseen corner's prediction beside 4t - 3."""
    header = ["method", "seed", "acc_all (%)", "acc_unseen (%)", "train_loss", "t", "4t-3", "unseen mean"]
    lines = tables.markdown_head(header)
    for r in records:
        lines.append(tables.markdown_row([r["method"], r["seed"], *(tables.cell(r[k], k) for k in PER_SEED_KEYS)]))
    return "\n".join(lines) + "\n"


def summary(records: list[dict], config: boolean.BooleanConfig, init: str) -> str:
    """summary.md: the setting, the per-seed table and mean +- std per method."""
    m, train_config = config.model, config.train_config(get_task(TASK))
    return (
        f"# 2Parity in PyTorch (the GOTU reference transformer)\n\n"
        f"Preset {config.preset}: width {m.dim}, depth {m.depth}, {m.heads} heads of {m.head_dim}, MLP {m.mlp_dim}; "
        f"Adam lr {train_config.learning_rate:g}, L2 weight decay {train_config.weight_decay:g}, batch "
        f"{train_config.batch_size}, {train_config.steps} steps; {init} initialisation; torch "
        f"{torch_gotu.version()}. The unseen corner's sign is right only when t > 0.75 (4t - 3 > 0).\n\n"
        + per_seed_table(records)
        + "\n"
        + tables.summary_table(records, PER_SEED_KEYS, ["method"])
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if torch_gotu.version() is None:
        raise ConfigError("needs torch: install the bench extra (pip install -e '.[bench]')")
    config = crosscheck_config(args)
    scope = boolean.BooleanScope(tasks=(TASK,))
    (task,), methods = boolean.STUDY.resolve(config, scope, args.methods, lambda message: None)
    for method in methods:
        check_method(method, args.init)
    out = store.ensure_writable_dir(args.out) if args.out else None
    env = store.environment()
    records = []
    for method in methods:
        for seed in args.seeds:
            records.append({**run(task, method, seed, config, args.init), **env})
            if out:
                store.write_jsonl(out / "results.jsonl", records)
                store.write_atomic(out / "summary.md", summary(records, config, args.init))
    print(summary(records, config, args.init))
    print(json.dumps({"task": TASK, "init": args.init, "records": records}))
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
