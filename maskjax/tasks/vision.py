"""Image classification as a maskjax task: the patch grid, its mask patterns and on-device augmentation.

Images stay uint8 on the device; `normalise` scales them inside the step. The mask prior is the 2D
locality pattern on the patch grid (`mask_patterns.locality_pattern`); its placebo spreads the same number of
open entries per row at random; the impulse heads' shifted identities are the target of the impulse
QK initialisation.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax

from maskjax import mask_patterns
from maskjax.data.images import ImageData
from maskjax.errors import ConfigError

# Horizontal flips keep the label of these datasets (clothes, objects, animals); not of digits.
FLIP_VALID = {"fashion_mnist": True, "cifar10": True, "cifar100": True, "imagenet100": True}
MASK_KINDS = ("oracle", "random")


@dataclasses.dataclass(frozen=True)
class VisionTask:
    """An image dataset cut into patch_size patches; `cls` adds a CLS token at position 0."""

    dataset: str
    image_size: int
    channels: int
    num_classes: int
    patch_size: int
    radius: int = 1
    cls: bool = False

    def __post_init__(self) -> None:
        if self.patch_size < 1 or self.image_size % self.patch_size:
            raise ConfigError(f"patch size {self.patch_size} does not divide image size {self.image_size}")
        if self.radius < 0:
            raise ConfigError(f"locality radius must be >= 0, got {self.radius}")

    @property
    def grid(self) -> int:
        return self.image_size // self.patch_size

    @property
    def tokens(self) -> int:
        return self.grid**2 + self.cls

    @property
    def flip(self) -> bool:
        return FLIP_VALID.get(self.dataset, False)


def task_of(data: ImageData, patch_size: int, radius: int = 1, cls: bool = False) -> VisionTask:
    height, width, channels = data.image_shape
    if height != width:
        raise ConfigError(f"{data.name} images are {height} x {width}; square images only")
    return VisionTask(data.name, height, channels, data.num_classes, patch_size, radius, cls)


def mask_pattern(task: VisionTask, kind: str, seed: int = 0) -> np.ndarray:
    """ "oracle": the locality pattern (CLS row and column open, `mask_patterns.CLS_POLICIES["open"]`);
    "random": as many open entries per row, placed at random from seed."""
    oracle = mask_patterns.locality_pattern(task.grid, task.radius, "open" if task.cls else None)
    if kind == "oracle":
        return oracle
    if kind == "random":
        return mask_patterns.random_rows(oracle, seed)
    raise ConfigError(f"no {kind!r} mask pattern for a vision task; known: {', '.join(MASK_KINDS)}")


def impulse_pattern(task: VisionTask, heads: int) -> np.ndarray:
    """Each head's shifted identity on the patch grid [heads, tokens, tokens] (`mask_patterns.impulse_patterns`);
    with a CLS token, the CLS row and column attend only to themselves."""
    patches = mask_patterns.impulse_patterns(task.grid, heads)
    if not task.cls:
        return patches
    out = np.zeros((heads, task.tokens, task.tokens), bool)
    out[:, 1:, 1:] = patches
    out[:, 0, 0] = True
    return out


def balanced_subset(labels: np.ndarray, fraction: float, seed: int) -> np.ndarray:
    """Sorted indices of a class-balanced subset: round(fraction * count) of every class (at least one),
    drawn with the seed."""
    if not 0 < fraction <= 1:
        raise ConfigError(f"training fraction must lie in (0, 1], got {fraction}")
    if fraction == 1:
        return np.arange(len(labels))
    rng = np.random.default_rng(seed)
    picked = []
    for label in np.unique(labels):
        members = np.flatnonzero(labels == label)
        picked.append(rng.choice(members, max(1, round(fraction * len(members))), replace=False))
    return np.sort(np.concatenate(picked))


def channel_stats(images: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-channel mean and std of uint8 images on the 0..1 scale."""
    scaled = images.reshape(-1, images.shape[-1]).astype(np.float64) / 255.0
    return scaled.mean(0).astype(np.float32), np.maximum(scaled.std(0), 1e-3).astype(np.float32)


def normalise(images: jax.Array, mean: jax.Array, std: jax.Array) -> jax.Array:
    return (images.astype(jnp.float32) / 255.0 - mean) / std


def augment(key: jax.Array, images_BHWC: jax.Array, pad: int, flip: bool) -> jax.Array:
    """Random crops of the images zero-padded by `pad` pixels, and (with flip) random horizontal flips,
    each image its own draw."""
    batch, height, width, _ = images_BHWC.shape
    crop_key, flip_key = jax.random.split(key)
    if pad:
        padded = jnp.pad(images_BHWC, ((0, 0), (pad, pad), (pad, pad), (0, 0)))
        offsets = jax.random.randint(crop_key, (batch, 2), 0, 2 * pad + 1)
        images_BHWC = jax.vmap(
            lambda image, o: jax.lax.dynamic_slice(image, (o[0], o[1], 0), (height, width, image.shape[-1]))
        )(padded, offsets)
    if flip:
        flipped = jax.random.bernoulli(flip_key, 0.5, (batch,))
        images_BHWC = jnp.where(flipped[:, None, None, None], images_BHWC[:, :, ::-1], images_BHWC)
    return images_BHWC


def softmax_regression_accuracy(
    train_images: np.ndarray, train_labels: np.ndarray, test_images: np.ndarray, test_labels: np.ndarray,
    num_classes: int, l2: float = 1e-4, iterations: int = 200,
) -> tuple[float, float]:
    """(test accuracy, final training loss) of a softmax regression on the raw pixels (0..1), fitted by L-BFGS:
    the floor any image model trained on the same images should clear."""
    x = jnp.asarray(train_images.reshape(len(train_images), -1), jnp.float32) / 255.0
    y = jnp.asarray(train_labels)
    params = (jnp.zeros((x.shape[1], num_classes)), jnp.zeros(num_classes))

    def loss(p):
        logits = x @ p[0] + p[1]
        return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean() + l2 * jnp.sum(p[0] ** 2)

    solver = optax.lbfgs()
    value_and_grad = optax.value_and_grad_from_state(loss)

    @jax.jit
    def step(p, state):
        value, grad = value_and_grad(p, state=state)
        updates, state = solver.update(grad, state, p, value=value, grad=grad, value_fn=loss)
        return optax.apply_updates(p, updates), state, value

    state = solver.init(params)
    for _ in range(iterations):
        params, state, value = step(params, state)
    test = jnp.asarray(test_images.reshape(len(test_images), -1), jnp.float32) / 255.0
    predicted = np.asarray(jnp.argmax(test @ params[0] + params[1], axis=-1))
    return float(np.mean(predicted == test_labels)), float(value)
