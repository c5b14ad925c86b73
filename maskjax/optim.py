"""The optimizer of every run: its config, the optax chain it builds, its learning-rate schedule and what
weight decay alone does to a parameter over a run."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from maskjax.errors import ConfigError
from maskjax.overrides import option

PyTree = Any


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """optimizer: "adam" (Adam with L2 decay added to the gradient, the paper's and torch's
    Adam(weight_decay)), "adamw" (decoupled decay) or "sgd" (momentum 0.9, L2 added to the gradient as
    torch's SGD(weight_decay)); schedule: "constant" or "cosine" (decay to 0 over `steps`, after a linear
    warmup from 0 over `warmup_steps`). clip_norm clips the gradient's global norm first when set.
    mask_weight_decay: the decay of every parameter named `mask_logits`; None decays them like the rest."""

    steps: int
    batch_size: int = 256
    learning_rate: float = 1e-5
    weight_decay: float = 1e-3
    chunk_steps: int = 200
    optimizer: str = "adam"
    schedule: str = "constant"
    mask_weight_decay: float | None = None
    warmup_steps: int = 0
    clip_norm: float | None = None


OPTIMIZERS = ("adam", "adamw", "sgd")


@dataclasses.dataclass(frozen=True, kw_only=True)
class OptimizerConfig:
    """The optimizer fields every study's config shares (a study's config subclasses it and may redeclare a
    field to change its default); `train_config` turns them into a run's TrainConfig."""

    weight_decay: float = option(1e-3, minimum=0, help="weight decay")
    optimizer: str = option(
        "adamw",
        choices=OPTIMIZERS,
        help="adam: Adam with L2 decay added to the gradient (the paper's Boolean runs); adamw: decoupled decay; "
        "sgd: momentum 0.9 with L2 decay (give it its own learning rate)",
    )
    mask_weight_decay: float | None = option(
        None, minimum=0, help="weight decay of the mask logits (default: every parameter's); 0 exempts them"
    )
    chunk_steps: int = option(200, help="steps per compiled chunk (probes and checkpoints fall between chunks)")
    qk_opt_steps: int = option(10_000, minimum=0, help="Adam steps that fit the optimised QK prior")

    def optimizer_config(self, steps: int, batch_size: int, learning_rate: float, **options: Any) -> TrainConfig:
        """The TrainConfig of `steps` steps of `batch_size` at `learning_rate`; options: schedule, warmup_steps,
        clip_norm."""
        return TrainConfig(
            steps,
            batch_size,
            learning_rate,
            self.weight_decay,
            self.chunk_steps,
            optimizer=self.optimizer,
            mask_weight_decay=self.mask_weight_decay,
            **options,
        )


SGD_MOMENTUM = 0.9


def is_mask_logits(path: tuple) -> bool:
    """Whether a parameter's key path names an attention mask's logits."""
    return any(getattr(key, "key", None) == "mask_logits" for key in path)


def weight_decay(config: TrainConfig) -> optax.GradientTransformation:
    """Adds decay x params to the updates; the mask logits take `mask_weight_decay` when it is set."""
    if config.mask_weight_decay is None or config.mask_weight_decay == config.weight_decay:
        return optax.add_decayed_weights(config.weight_decay)

    def where(wanted: bool) -> Callable[[PyTree], PyTree]:
        return lambda params: jax.tree_util.tree_map_with_path(lambda p, _: is_mask_logits(p) == wanted, params)

    return optax.chain(
        optax.add_decayed_weights(config.weight_decay, mask=where(False)),
        optax.add_decayed_weights(config.mask_weight_decay, mask=where(True)),
    )


def make_optimizer(config: TrainConfig) -> optax.GradientTransformation:
    """The config's optimizer, weight decay, learning-rate schedule and gradient clipping."""
    optimizer = _optimizer(config)
    if config.clip_norm is None:
        return optimizer
    return optax.chain(optax.clip_by_global_norm(config.clip_norm), optimizer)


def learning_rate(config: TrainConfig) -> optax.ScalarOrSchedule:
    """The config's learning rate: a constant, or optax's cosine schedule (after a linear warmup)."""
    if config.schedule == "constant":
        return config.learning_rate
    if config.schedule == "cosine" and config.warmup_steps:
        return optax.warmup_cosine_decay_schedule(0.0, config.learning_rate, config.warmup_steps, max(1, config.steps))
    if config.schedule == "cosine":
        return optax.cosine_decay_schedule(config.learning_rate, max(1, config.steps))
    raise ConfigError(f"unknown schedule {config.schedule!r}; expected 'constant' or 'cosine'")


def learning_rates(config: TrainConfig) -> np.ndarray:
    """The rate of each of the run's steps, in numpy float64, as `learning_rate`'s optax schedule gives them.

    Why: XLA's own cosine moves with its optimisation level by ~1e-9 of a rate, enough to move the last
    printed digit of a prediction built on it (`decay_only_change`)."""
    steps, rate, warmup = config.steps, config.learning_rate, config.warmup_steps
    t = np.arange(steps, dtype=np.float64)
    if config.schedule == "constant":
        return np.full(steps, rate, np.float64)
    if config.schedule != "cosine":
        raise ConfigError(f"unknown schedule {config.schedule!r}; expected 'constant' or 'cosine'")
    span = max(1, max(1, steps) - warmup)
    cosine = 0.5 * rate * (1 + np.cos(np.pi * np.minimum(t - warmup, span) / span))
    return np.where(t < warmup, rate * t / max(1, warmup), cosine)


def decay_only_change(config: TrainConfig, initial: np.ndarray, dtype: str = "float64") -> np.ndarray:
    """How far weight decay alone moves mask logits that start at `initial` over a run: |M_0 - M_T| per
    entry, the run's optax chain stepped `steps` times with a zero data gradient.

    Why: a learnable mask's measured movement is read beside this, the rest being what the gradient did.
    AdamW's decoupled decay has a closed form, m * prod_t (1 - lr_t * wd), but Adam and SGD pass L2 decay
    through their normalised or momentum step (with no data gradient Adam moves every logit by about the
    learning rate per step), so the chain itself is stepped, for every optimizer alike: at a unit rate,
    each step's update scaled by `learning_rates` (every chain here scales by the rate last). The chain is
    odd, so an entry's path depends only on its magnitude: each distinct |M_0| is stepped once. dtype
    "float64" gives the prediction free of rounding (over tens of thousands of steps that each move a logit
    by ~1e-5 of itself, float32 shifts it by ~1e-4 of itself); "float32" repeats training's own arithmetic,
    rounding included, so a mask the data never moved matches it to the last bit (under a cosine schedule,
    up to a rate that optax's float32 rounds an ulp apart)."""
    if dtype not in ("float32", "float64"):
        raise ConfigError(f"decay alone is stepped in float32 or float64, not {dtype!r}")
    magnitudes, where = np.unique(np.abs(np.asarray(initial, np.float64)), return_inverse=True)
    start = magnitudes.astype(dtype).astype(np.float64)
    moved = _decayed_alone(config, tuple(float(m) for m in start), dtype)
    return np.abs(start - moved)[where].reshape(np.shape(initial))


@functools.lru_cache(maxsize=64)
def _decayed_alone(config: TrainConfig, magnitudes: tuple[float, ...], dtype: str) -> np.ndarray:
    optimizer = make_optimizer(dataclasses.replace(config, learning_rate=1.0, schedule="constant", warmup_steps=0))

    def step(carry: tuple, rate: jax.Array) -> tuple:
        params, state = carry
        updates, state = optimizer.update(jax.tree.map(jnp.zeros_like, params), state, params)
        return (jax.tree.map(lambda p, u: p + rate * u, params, updates), state), None

    with jax.enable_x64(dtype == "float64"):
        params = {"mask_logits": jnp.asarray(magnitudes, dtype)}
        rates = jnp.asarray(learning_rates(config), dtype)
        run = jax.jit(lambda carry, rates: jax.lax.scan(step, carry, rates)[0][0])
        return np.asarray(run((params, optimizer.init(params)), rates)["mask_logits"], np.float64)


def _optimizer(config: TrainConfig) -> optax.GradientTransformation:
    rate = learning_rate(config)
    if config.mask_weight_decay is not None and not config.mask_weight_decay >= 0:
        raise ConfigError(f"mask weight decay must be >= 0, got {config.mask_weight_decay}")
    if config.optimizer == "adam":
        return optax.chain(weight_decay(config), optax.adam(rate))
    if config.optimizer == "sgd":
        return optax.chain(weight_decay(config), optax.sgd(rate, momentum=SGD_MOMENTUM))
    if config.optimizer == "adamw":
        if config.mask_weight_decay is None:
            return optax.adamw(rate, weight_decay=config.weight_decay)
        # optax.adamw's own chain, with the decay split between the mask logits and the rest.
        return optax.chain(optax.scale_by_adam(), weight_decay(config), optax.scale_by_learning_rate(rate))
    raise ConfigError(f"unknown optimizer {config.optimizer!r}; known: {', '.join(OPTIMIZERS)}")
