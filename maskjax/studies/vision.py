"""The vision study: a ViT per (dataset, training fraction, method), all seeds one vmapped group.

With the full training set every run shares the data; with a fraction each seed draws its own
class-balanced subset (the data then carries the runs axis). Augmentation (random crop, flip) runs
inside the jitted step from each run's key and step. After every chunk a probe measures test
accuracy and loss on a fixed test subset, the attention drift on a few test images and, for a mask,
how far M moved and how much of it kept its sign.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from maskjax import mask_patterns, plots, probes, qk_priors, runs, tables
from maskjax.data import images
from maskjax.data.images import ImageData
from maskjax.errors import ConfigError
from maskjax.methods import Method
from maskjax.models.layers import ModelConfig
from maskjax.models.vit import ViT
from maskjax.optim import OptimizerConfig, TrainConfig
from maskjax.overrides import option, with_default
from maskjax.sharding import to_host
from maskjax.study import Group, Plan, Study, register
from maskjax.tasks import vision as vt
from maskjax.train import Trained, TrainInputs, variables_of


@dataclasses.dataclass(frozen=True, kw_only=True)
class VisionConfig(OptimizerConfig):
    """epochs over each run's training set set the steps, at least min_steps (so a small training fraction
    still trains), unless `steps` overrides them; a linear warmup over warmup_fraction of the steps
    precedes the cosine decay."""

    preset: str
    model: ModelConfig
    patch_size: int = option(help="patch size (must divide the image size)")
    epochs: int = option(help="epochs over each training set")
    batch_size: int = option(512, help="images per step (at most the training set)")
    learning_rate: float = option(1e-3, above=0, help="peak learning rate (warmup, then cosine decay)")
    weight_decay: float = with_default(OptimizerConfig, "weight_decay", 0.01)
    min_steps: int = option(0, minimum=0, help="at least this many steps, whatever the epochs give")
    warmup_fraction: float = option(0.05, minimum=0, below=1, help="share of the steps in linear warmup")
    clip_norm: float | None = option(1.0, above=0, help="clip the gradient's global norm (none: no clipping)")
    open_value: float = option(10.0, flag="open", help="mask logit of open entries")
    closed_value: float = option(-10.0, flag="closed", help="mask logit of closed entries")
    radius: int = option(1, minimum=0, help="Chebyshev radius of the locality mask")
    pool: str = option("gap", choices=("gap", "cls"), help="global average pooling or a CLS token")
    crop_pad: int = option(4, minimum=0, help="pixels of padding the random crop moves within")
    steps: int | None = option(None, help="training steps, overriding the epochs")
    eval_batch: int = option(1000, help="test images scored at once")
    probe_images: int = option(512, help="test images of the per-chunk accuracy probe")
    drift_images: int = option(16, help="test images of the attention-drift probe")
    impulse_position_scale: float = option(
        qk_priors.IMPULSE_POSITION_SCALE,
        above=0,
        help="factor on the position embeddings under impulse init (the published 18)",
    )

    def train_config(self, n_train: int) -> TrainConfig:
        batch = min(self.batch_size, n_train)
        steps = self.steps if self.steps is not None else max(self.epochs * (n_train // batch), self.min_steps)
        warmup = int(self.warmup_fraction * steps)
        return self.optimizer_config(
            steps, batch, self.learning_rate, schedule="cosine", warmup_steps=warmup, clip_norm=self.clip_norm
        )


PRESETS: dict[str, VisionConfig] = {
    # ViT-Tiny as the paper's CIFAR runs (Zheng et al. 2024's recipe: 32 x 32, patch 2, GAP, AdamW 1e-3
    # cosine, wd 0.01, batch 512, 200 epochs, 10 warmup); crop + flip stand in for RandAugment.
    "paper": VisionConfig(
        preset="paper",
        model=ModelConfig(dim=192, depth=12, heads=3, head_dim=64, mlp_dim=768),
        patch_size=2,
        epochs=200,
    ),
    # Sized for a 2-core CPU before any mask result (docs/results/vision_quick.md says how): 28 x 28
    # Fashion-MNIST in 4 x 4 patches (a 7 x 7 grid), width 32, depth 2, 4 heads; 4 epochs of the full set,
    # and at least 600 steps at a small fraction.
    "quick": VisionConfig(
        preset="quick",
        model=ModelConfig(dim=32, depth=2, heads=4, head_dim=8, mlp_dim=64),
        patch_size=4,
        epochs=4,
        min_steps=600,
        batch_size=128,
        crop_pad=2,
        eval_batch=500,
        probe_images=500,
    ),
    # Named by docs/design.md's rule ("Sizes that learn"): the first rung at which vanilla beats the softmax
    # regression on the same images by 3 points in at least 3 of 4 seeds, at 5% and on the full set
    # (docs/results/vision_ladder.md, rung v64d4p7e30): the quick recipe at width 64, depth 4, in 7 x 7
    # patches (a 4 x 4 grid, in which the 3 x 3 window opens 4-9 of 16 keys), 30 epochs of the full set
    # (14,040 steps) and 6,900 steps at 5%.
    "medium": VisionConfig(
        preset="medium",
        model=ModelConfig(dim=64, depth=4, heads=4, head_dim=16, mlp_dim=128),
        patch_size=7,
        epochs=30,
        min_steps=6900,
        batch_size=128,
        crop_pad=2,
        eval_batch=500,
        probe_images=500,
    ),
    "test": VisionConfig(
        preset="test",
        model=ModelConfig(dim=16, depth=1, heads=2, head_dim=8, mlp_dim=16),
        patch_size=4,
        epochs=1,
        batch_size=8,
        steps=6,
        chunk_steps=3,
        warmup_fraction=0.0,
        crop_pad=1,
        eval_batch=8,
        probe_images=8,
        drift_images=2,
        qk_opt_steps=10,
    ),
}


def make_task(data: ImageData, config: VisionConfig) -> vt.VisionTask:
    return vt.task_of(data, config.patch_size, config.radius, config.pool == "cls")


def make_model(task: vt.VisionTask, method: Method, config: VisionConfig, mask_init=None) -> ViT:
    return ViT(
        task.num_classes,
        task.image_size,
        task.patch_size,
        config.model,
        method.mask_mode,
        mask_init,
        method.qk_norm,
        pool=config.pool,
    )


def initial_mask(task: vt.VisionTask, method: Method, config: VisionConfig, seed: int = 0) -> np.ndarray:
    """The method's initial M [tokens, tokens] for one seed (shared by heads and layers)."""
    return runs.initial_mask_logits(
        lambda kind, s: vt.mask_pattern(task, kind, s), method, seed, (config.open_value, config.closed_value)
    )


def qk_target(task: vt.VisionTask, method: Method, config: VisionConfig) -> tuple[np.ndarray, np.ndarray]:
    """(open pattern, target attention) [heads, tokens, tokens] a QK initialisation aims at: the impulse
    heads' shifted identities for impulse (uniform on the rows whose shift leaves the grid, which the
    construction leaves to noise), the locality pattern's row distribution otherwise."""
    heads = config.model.heads
    if method.qk_init == "impulse":
        pattern = vt.impulse_pattern(task, heads)
        count = pattern.sum(-1, keepdims=True)
        return pattern, np.where(count > 0, pattern / np.maximum(count, 1), 1.0 / pattern.shape[-1])
    pattern = vt.mask_pattern(task, "oracle")
    logits = np.asarray(mask_patterns.mask_logits(pattern, config.open_value, config.closed_value))
    return np.broadcast_to(pattern, (heads, *pattern.shape)), np.broadcast_to(
        mask_patterns.row_distribution(logits), (heads, *pattern.shape)
    )


class VisionGroup(NamedTuple):
    """What one group trains: a dataset at a training fraction, by a method."""

    data: ImageData
    fraction: float
    method: Method


class VisionInputs(NamedTuple):
    """One group's training inputs, and what its records and figures need."""

    inputs: TrainInputs
    task: vt.VisionTask
    model: ViT
    target: np.ndarray
    mean: jax.Array
    std: jax.Array
    drift_images: jax.Array


def make_group(group: VisionGroup, seeds: Sequence[int], config: VisionConfig) -> VisionInputs:
    """The one-run init, loss, augmentation and probe of (dataset, fraction, method) and every seed's inputs:
    its key, its initial mask and, below the full set, its own class-balanced training subset.

    The probe measures after every chunk the test accuracy and loss on a fixed test subset, the attention's
    drift and its weight outside the window on a few test images and, for a mask, how far M moved."""
    data, fraction, method = group
    task = make_task(data, config)
    mean, std = (jnp.asarray(v) for v in vt.channel_stats(data.train_images))
    subsets = [vt.balanced_subset(data.train_labels, fraction, seed) for seed in seeds]
    per_run = fraction < 1
    if per_run:
        train_data = (
            jnp.asarray(np.stack([data.train_images[s] for s in subsets])),
            jnp.asarray(np.stack([data.train_labels[s] for s in subsets])),
        )
    else:
        train_data = (jnp.asarray(data.train_images), jnp.asarray(data.train_labels))
    model = make_model(task, method, config)
    run_masks = jnp.asarray(np.stack([initial_mask(task, method, config, seed) for seed in seeds]))
    pattern, target = qk_target(task, method, config)
    init_run = runs.prior_init(
        lambda mask_logits: make_model(task, method, config, mask_logits),
        method,
        vt.normalise(jnp.asarray(data.train_images[:1]), mean, std),
        jnp.asarray(pattern, jnp.float32),
        jnp.asarray(target, jnp.float32),
        config.qk_opt_steps,
        impulse_position_scale=config.impulse_position_scale,
    )

    def loss(params, constants, batch):
        images, labels = batch
        logits = model.apply(variables_of(params, constants), vt.normalise(images, mean, std))
        return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()

    def augment(key, batch):
        images, labels = batch
        return vt.augment(key, images, config.crop_pad, task.flip), labels

    probe_x = jnp.asarray(data.test_images[: config.probe_images])
    probe_y = jnp.asarray(data.test_labels[: config.probe_images])
    drift_x = vt.normalise(probe_x[: config.drift_images], mean, std)
    window = jnp.asarray(vt.mask_pattern(task, "oracle"), jnp.float32)

    def probe(initial, state) -> dict[str, jax.Array]:
        variables = variables_of(state.params, state.constants)
        start = variables_of(initial.params, initial.constants)
        logits = model.apply(variables, vt.normalise(probe_x, mean, std))
        out = {
            "test_acc_probe": (logits.argmax(-1) == probe_y).mean(),
            "test_loss_probe": optax.softmax_cross_entropy_with_integer_labels(logits, probe_y).mean(),
            "attention_drift": runs.attention_drift(model, start, variables, drift_x),
            "attention_outside_window": probes.outside_mass(runs.sown(model, variables, drift_x, "attention"), window),
        }
        if method.mask_mode != "none":
            out |= probes.mask_persistence(
                runs.mask_logits_of(model, method, start),
                runs.mask_logits_of(model, method, variables),
            )
        return out

    train_config = config.train_config(len(subsets[0]))
    inputs = TrainInputs(
        init_run, loss, runs.seed_keys(seeds), (run_masks,), train_data, train_config, per_run, augment, probe
    )
    return VisionInputs(inputs, task, model, np.asarray(target), mean, std, drift_x)


def record_group(
    group: VisionGroup,
    seeds: Sequence[int],
    config: VisionConfig,
    built: VisionInputs,
    trained: Trained,
    started: float,
) -> tuple[list[dict], dict[str, np.ndarray]]:
    """One record per seed of a trained (dataset, fraction, method) group and, for the plots, seed 0's masks
    [layers, heads, N, N] at init and after training and its attention on the first test image."""
    data, fraction, method = group
    model, mean, std = built.model, built.mean, built.std
    initial, final, curves, curve_steps = trained.initial, trained.final, trained.probes, trained.probe_steps
    test_acc, test_loss = evaluate(model, final, data, mean, std, config.eval_batch)
    pattern_error = runs.layer0_pattern_error(model, initial, built.drift_images, built.target)
    outcomes = runs.outcome_fields(trained, built.inputs.train_config, time.time() - started, ~np.isfinite(test_loss))
    records = []
    for i, seed in enumerate(seeds):
        diverged = outcomes[i]["diverged"]
        records.append(
            {
                "dataset": data.name,
                "train_fraction": fraction,
                "method": method.name,
                "seed": int(seed),
                "n_train": int(built.inputs.n_train),
                "test_acc": None if diverged else float(test_acc[i]),
                "test_loss": None if diverged else float(test_loss[i]),
                "pattern_error_init": pattern_error[i],
                "drift_steps": curve_steps,
                **runs.stored_curves(curves, i),
                **outcomes[i],
            }
        )
    first = vt.normalise(jnp.asarray(data.test_images[:1]), mean, std)
    start, end = (jax.tree.map(lambda a: a[0], s) for s in (initial, final))
    start_vars, end_vars = variables_of(start.params, start.constants), variables_of(end.params, end.constants)
    plots = {"attention": to_host(runs.sown(model, end_vars, first, "attention"))[:, 0]}
    if method.mask_mode != "none":
        plots["mask_init"] = to_host(runs.mask_logits_of(model, method, start_vars))
        plots["mask_final"] = to_host(runs.mask_logits_of(model, method, end_vars))
    return records, plots


def evaluate(model: ViT, state, data: ImageData, mean, std, eval_batch: int) -> tuple[np.ndarray, np.ndarray]:
    """Per run, accuracy and mean cross-entropy on the whole test split: ([runs], [runs])."""

    def score(variables, batch, filler):
        images, labels = batch
        logits = model.apply(variables, vt.normalise(images, mean, std))
        correct = logits.argmax(-1) == labels
        loss = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
        return (correct.sum(), loss.sum()) if filler is None else ((correct * filler).sum(), (loss * filler).sum())

    correct, total = runs.evaluate_runs(score, state, [data.test_images, data.test_labels], eval_batch)
    n = np.float32(len(data.test_labels))
    return correct.astype(np.float32) / n, total / n


LADDER_MARGIN = 0.03  # vanilla must beat the softmax regression on the same images by 3 points


def ladder_rule(records: Sequence[dict], linear: Sequence[dict], margin: float = LADDER_MARGIN) -> dict:
    """docs/design.md's rule for one (rung, training fraction): how many vanilla seeds beat the softmax
    regression on the same images (the seed's own subset; the full set has one fit) by `margin`; passes
    when at least three quarters do."""
    reference = {(r["train_fraction"], r["seed"]): r["test_acc"] for r in linear}
    beat = []
    for r in records:
        key = (r["train_fraction"], r["seed"]) if r["train_fraction"] < 1 else (1.0, 0)
        if key not in reference:
            raise ConfigError(f"no softmax-regression record for training fraction {key[0]:g}, seed {key[1]}")
        beat.append(r["test_acc"] is not None and r["test_acc"] >= reference[key] + margin)
    return runs.seed_verdict(beat)


@dataclasses.dataclass(frozen=True)
class VisionScope:
    dataset: str = option("fashion_mnist", choices=images.DATASETS, help="the image dataset")
    data_dir: Path | None = option(None, help="folder holding the dataset's files (see README)")
    image_size: int | None = option(None, help="resolution ImageNet-100 is read at (default 64)")
    train_fractions: tuple[float, ...] = option(
        (1.0,), flag="train-fraction", above=0, maximum=1, help="class-balanced training fractions in (0, 1], a list"
    )


KEYS = ("test_acc", "test_loss", "train_loss", "pattern_error_init")
GROUPS = ("dataset", "train_fraction", "method")
CURVE_KEYS = ("test_acc_probe", "test_loss_probe")
PERSISTENCE_KEYS = ("attention_drift", "attention_outside_window", "mask_change_mean", "mask_sign_kept")


@dataclasses.dataclass(frozen=True)
class VisionData:
    images: ImageData
    task: vt.VisionTask


def centre_query(task: vt.VisionTask, matrix_NN: np.ndarray) -> np.ndarray:
    """The row of the patch nearest the grid's centre, reshaped on the grid [grid, grid]."""
    offset = int(task.cls)
    centre = (task.grid // 2) * task.grid + task.grid // 2 + offset
    return np.asarray(matrix_NN)[centre, offset:].reshape(task.grid, task.grid)


def plot_attention(task: vt.VisionTask, image: np.ndarray, per_method: dict[str, dict], path: Path) -> None:
    """The first test image, then per method (seed 0, trained) the centre patch's attention on the grid in
    the first and the last layer, mean over heads."""
    panels = {"first test image": np.asarray(image, np.float64).mean(-1)}
    for method, maps in per_method.items():
        attention = maps["attention"]
        panels[f"{method}: layer 0"] = centre_query(task, attention[0].mean(0))
        panels[f"{method}: layer {len(attention) - 1}"] = centre_query(task, attention[-1].mean(0))
    plots.plot_matrices(panels, path, columns=3)


def plot_masks(task: vt.VisionTask, maps: dict[str, np.ndarray], path: Path) -> None:
    """Per layer, the learned M after training (mean over heads): the centre patch's row on the grid and
    the whole matrix; the initial M's row first, for reference."""
    panels = {"init: centre patch": centre_query(task, maps["mask_init"][0].mean(0))}
    for layer, mask in enumerate(maps["mask_final"]):
        panels[f"layer {layer}: centre patch"] = centre_query(task, mask.mean(0))
        panels[f"layer {layer}: M"] = mask.mean(0)
    plots.plot_matrices(panels, path, columns=3)


class VisionStudy(Study):
    """Every (training fraction, method) is one group over its seeds, on one dataset."""

    name = "vision"
    title = "Vision study"
    description = "ViT study: python -m experiments.vision --dataset=fashion_mnist --seeds=4"
    config_type = VisionConfig
    scope_type = VisionScope
    presets = PRESETS
    default_seeds = 4
    default_methods = ("vanilla", "mask", "mimetic", "impulse")

    def make_data(self, config: VisionConfig, scope: VisionScope, log) -> VisionData:
        log(f"reading {scope.dataset}")
        data = images.load(scope.dataset, scope.data_dir, scope.image_size)
        return VisionData(data, make_task(data, config))

    def sample_data(self, config: VisionConfig, scope: VisionScope) -> VisionData:
        """Random images of the dataset's shapes (Fashion-MNIST's 60,000 of 28 x 28 x 1; CIFAR-10's
        50,000 of 32 x 32 x 3 at the paper preset)."""
        shape, n_train = ((28, 28, 1), 60_000) if config.preset != "paper" else ((32, 32, 3), 50_000)
        rng = np.random.default_rng(0)
        data = ImageData(
            "fashion_mnist" if shape[-1] == 1 else "cifar10",
            rng.integers(0, 256, (n_train, *shape), dtype=np.uint8),
            rng.integers(0, 10, n_train).astype(np.int32),
            rng.integers(0, 256, (16, *shape), dtype=np.uint8),
            rng.integers(0, 10, 16).astype(np.int32),
            10,
        )
        return VisionData(data, make_task(data, config))

    def groups(self, plan: Plan) -> list[Group[VisionGroup]]:
        data = plan.data.images
        return [
            Group(
                {"dataset": data.name, "train_fraction": fraction, "method": method.name},
                VisionGroup(data, fraction, method),
            )
            for fraction in plan.scope.train_fractions
            for method in plan.methods
        ]

    def build(self, config: VisionConfig, spec: VisionGroup, seeds: Sequence[int]) -> VisionInputs:
        return make_group(spec, seeds, config)

    def record(self, config, spec: VisionGroup, seeds, built: VisionInputs, trained: Trained, started: float):
        return record_group(spec, seeds, config, built, trained, started)

    def summary(self, plan: Plan, records: list[dict], reference: list[dict]) -> tuple[str, str]:
        table = tables.summary_table(records, KEYS, GROUPS)
        parts = [
            table,
            tables.paired_table(records, "test_acc", "mask", ("dataset", "train_fraction")),
            tables.per_seed_table(records, "test_acc", GROUPS),
        ]
        return "\n".join(part for part in parts if part), table

    def plot(self, plan: Plan, records: list[dict], reference: list[dict], maps) -> None:
        data, task = plan.data.images, plan.data.task
        for fraction in dict.fromkeys(r["train_fraction"] for r in records):
            name = f"{data.name}_{fraction:g}"
            done = [r for r in records if r["train_fraction"] == fraction]
            plots.plot_step_curves(done, plan.out / f"curves_{name}.png", CURVE_KEYS)
            plots.plot_drift(done, plan.out / f"persistence_{name}.png", PERSISTENCE_KEYS)
            # A folder written before maps were kept has none for its older groups; those are left out.
            methods = dict.fromkeys(r["method"] for r in done)
            fields = {"dataset": data.name, "train_fraction": fraction}
            ours = {m: a for m in methods if (a := maps({**fields, "method": m})) is not None}
            plot_attention(task, data.test_images[0], ours, plan.out / f"attention_{name}.png")
            for method, arrays in ours.items():
                if "mask_final" in arrays:
                    plot_masks(task, arrays, plan.out / f"mask_{name}_{method}.png")


STUDY = register(VisionStudy())
