"""Image classification datasets as numpy arrays, read once, offline.

Every loader returns `ImageData`: uint8 images [N, H, W, C] and int32 labels for the train and test
splits. Fashion-MNIST is read from its IDX files (Debian's `dataset-fashion-mnist` installs them in
/usr/share/datasets/fashion-mnist); CIFAR-10 / CIFAR-100 from the official python-pickle folders in
--data-dir, or through tensorflow-datasets (the `[vision]` extra) when no folder is given; ImageNet-100
from a class-folder layout (train/<class>/*, val/<class>/*) resized to a reduced resolution.
Nothing here downloads: a missing file is a FileNotFoundError that says where to get it.
"""

from __future__ import annotations

import gzip
import pickle
from pathlib import Path
from typing import NamedTuple

import numpy as np

from maskjax.errors import ConfigError, MissingFileError

FASHION_MNIST_DIR = Path("/usr/share/datasets/fashion-mnist")
IDX_TYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


class ImageData(NamedTuple):
    name: str
    train_images: np.ndarray
    train_labels: np.ndarray
    test_images: np.ndarray
    test_labels: np.ndarray
    num_classes: int

    @property
    def image_shape(self) -> tuple[int, int, int]:
        return tuple(self.train_images.shape[1:])


def read_idx(path: Path) -> np.ndarray:
    """An IDX file (gzipped or not) as a numpy array of its stored type and shape."""
    path = Path(path)
    if not path.is_file():
        raise MissingFileError(f"{path} not found")
    raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in IDX_TYPES:
        raise ConfigError(f"{path} is not an IDX file (bad magic number)")
    ndim = raw[3]
    shape = tuple(int(d) for d in np.frombuffer(raw, ">u4", ndim, 4))
    dtype = np.dtype(IDX_TYPES[raw[2]])
    expected = int(np.prod(shape)) * dtype.itemsize
    body = raw[4 + 4 * ndim :]
    if len(body) != expected:
        raise ConfigError(f"{path} holds {len(body)} bytes of data, its header promises {expected}")
    return np.frombuffer(body, dtype).reshape(shape).astype(dtype.newbyteorder("="))


def _find(directory: Path, stem: str) -> Path:
    for name in (f"{stem}.gz", stem):
        if (directory / name).is_file():
            return directory / name
    raise MissingFileError(f"{directory / stem}[.gz] not found")


def load_fashion_mnist(data_dir: Path | None = None) -> ImageData:
    """Fashion-MNIST from its four IDX files: 60,000 / 10,000 images, 28 x 28 x 1, 10 classes."""
    directory = Path(data_dir) if data_dir is not None else FASHION_MNIST_DIR
    if not directory.is_dir():
        raise MissingFileError(
            f"no Fashion-MNIST folder at {directory}: `apt-get install dataset-fashion-mnist`, "
            "or pass --data-dir=DIR holding train-images-idx3-ubyte.gz and the other three IDX files"
        )
    split = {
        prefix: (
            read_idx(_find(directory, f"{prefix}-images-idx3-ubyte")),
            read_idx(_find(directory, f"{prefix}-labels-idx1-ubyte")),
        )
        for prefix in ("train", "t10k")
    }
    for prefix, (images, labels) in split.items():
        if images.ndim != 3 or labels.shape != images.shape[:1]:
            raise ConfigError(
                f"{prefix} IDX files of {directory} disagree: images {images.shape}, labels {labels.shape}"
            )
    (train_x, train_y), (test_x, test_y) = split["train"], split["t10k"]
    return ImageData(
        "fashion_mnist", train_x[..., None], train_y.astype(np.int32), test_x[..., None], test_y.astype(np.int32), 10
    )


def _unpickle(path: Path) -> dict:
    if not path.is_file():
        raise MissingFileError(f"{path} not found")
    with path.open("rb") as f:
        return pickle.load(f, encoding="bytes")


def _cifar_arrays(batches: list[dict], label_key: bytes) -> tuple[np.ndarray, np.ndarray]:
    images = np.concatenate([np.asarray(b[b"data"], np.uint8) for b in batches]).reshape(-1, 3, 32, 32)
    labels = np.concatenate([np.asarray(b[label_key], np.int32) for b in batches])
    return images.transpose(0, 2, 3, 1), labels


def load_cifar(name: str, data_dir: Path | None = None) -> ImageData:
    """CIFAR-10 or CIFAR-100 (fine labels). With data_dir: the official python version unpacked there
    (cifar-10-batches-py/ or cifar-100-python/, or those files directly); without: tensorflow-datasets."""
    if name not in ("cifar10", "cifar100"):
        raise ConfigError(f"unknown CIFAR dataset {name!r}; expected cifar10 or cifar100")
    if data_dir is None:
        return _load_tfds(name, {"cifar10": 10, "cifar100": 100}[name])
    directory = Path(data_dir)
    sub = directory / ("cifar-10-batches-py" if name == "cifar10" else "cifar-100-python")
    directory = sub if sub.is_dir() else directory
    if name == "cifar10":
        train = [_unpickle(directory / f"data_batch_{i}") for i in range(1, 6)]
        test = [_unpickle(directory / "test_batch")]
        key, classes = b"labels", 10
    else:
        train, test = [_unpickle(directory / "train")], [_unpickle(directory / "test")]
        key, classes = b"fine_labels", 100
    return ImageData(name, *_cifar_arrays(train, key), *_cifar_arrays(test, key), classes)


def _load_tfds(name: str, num_classes: int, data_dir: Path | None = None) -> ImageData:
    """A tfds image dataset read into numpy once (train and test splits)."""
    try:
        import tensorflow_datasets as tfds
    except ImportError:
        raise MissingFileError(
            f"{name} without --data-dir needs tensorflow-datasets: pip install 'maskjax[vision]' "
            "(or unpack the dataset's python version and pass --data-dir)"
        ) from None
    arrays = {}
    for split in ("train", "test"):
        # Not batch_size=-1: under tfds.testing.mock_data the split sizes are unknown, tfds then asks
        # TensorFlow for padded_batch(sys.maxsize), which aborts the process (std::length_error, TF 2.16-2.21).
        chunks = list(tfds.as_numpy(tfds.load(name, split=split, batch_size=10_000, data_dir=data_dir)))
        arrays[split] = (
            np.concatenate([c["image"] for c in chunks]).astype(np.uint8),
            np.concatenate([c["label"] for c in chunks]).astype(np.int32),
        )
    return ImageData(name, *arrays["train"], *arrays["test"], num_classes)


def load_image_folder(name: str, data_dir: Path, size: int, classes: list[str] | None = None) -> ImageData:
    """A class-folder dataset (data_dir/train/<class>/*, data_dir/val/<class>/*), e.g. ImageNet-100, each
    image resized to size x size RGB. classes: the class folders to read (all of train/ when None)."""
    from PIL import Image

    root = Path(data_dir)
    if not (root / "train").is_dir() or not (root / "val").is_dir():
        raise MissingFileError(f"{root} needs train/<class>/ and val/<class>/ folders of images")
    names = classes if classes is not None else sorted(p.name for p in (root / "train").iterdir() if p.is_dir())
    if not names:
        raise MissingFileError(f"no class folders in {root / 'train'}")

    def split(part: str) -> tuple[np.ndarray, np.ndarray]:
        images, labels = [], []
        for label, cls in enumerate(names):
            files = sorted(p for p in (root / part / cls).glob("*") if p.is_file())
            if not files:
                raise MissingFileError(f"no images in {root / part / cls}")
            for file in files:
                with Image.open(file) as image:
                    images.append(np.asarray(image.convert("RGB").resize((size, size), Image.BILINEAR), np.uint8))
                labels.append(label)
        return np.stack(images), np.asarray(labels, np.int32)

    return ImageData(name, *split("train"), *split("val"), len(names))


DATASETS = ("fashion_mnist", "cifar10", "cifar100", "imagenet100")


def load(name: str, data_dir: Path | None = None, image_size: int | None = None) -> ImageData:
    """A dataset by name; image_size is the resolution ImageNet-100 is read at (default 64)."""
    if name == "fashion_mnist":
        return load_fashion_mnist(data_dir)
    if name in ("cifar10", "cifar100"):
        return load_cifar(name, data_dir)
    if name == "imagenet100":
        if data_dir is None:
            raise MissingFileError("imagenet100 needs --data-dir with train/<class>/ and val/<class>/ folders")
        return load_image_folder(name, data_dir, image_size or 64)
    raise ConfigError(f"unknown dataset {name!r}; known: {', '.join(DATASETS)}")
