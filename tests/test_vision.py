"""The vision study's parts: locality prior, loaders (offline), augmentation, the ViT and the CLI."""

import dataclasses
import gzip
import json
import pickle
from pathlib import Path

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from golden_check import assert_matches_golden

from maskjax import mask_patterns
from maskjax.data import images
from maskjax.methods import get_method
from maskjax.models.layers import ModelConfig
from maskjax.models.vit import ViT
from maskjax.studies import vision as study
from maskjax.tasks import vision as vt


def write_idx(path, array: np.ndarray, compress: bool = True) -> None:
    header = bytes([0, 0, 0x08, array.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in array.shape)
    raw = header + np.ascontiguousarray(array, np.uint8).tobytes()
    path.write_bytes(gzip.compress(raw) if compress else raw)


@pytest.fixture(scope="module")
def tiny_fashion(tmp_path_factory):
    """A Fashion-MNIST-shaped folder: 40 train images (4 per class) and 16 test images, 28 x 28."""
    folder = tmp_path_factory.mktemp("fashion")
    rng = np.random.default_rng(0)
    for prefix, n in (("train", 40), ("t10k", 16)):
        labels = np.arange(n) % 10
        write_idx(folder / f"{prefix}-images-idx3-ubyte.gz", rng.integers(0, 256, (n, 28, 28)))
        write_idx(folder / f"{prefix}-labels-idx1-ubyte.gz", labels)
    return folder


def test_locality_open_counts_corner_edge_interior():
    open_ = mask_patterns.locality_pattern(5, radius=1)
    counts = open_.sum(1).reshape(5, 5)
    assert counts[0, 0] == counts[0, 4] == counts[4, 0] == counts[4, 4] == 4
    assert counts[0, 2] == counts[2, 0] == counts[4, 2] == counts[2, 4] == 6
    assert counts[2, 2] == counts[1, 1] == 9
    np.testing.assert_array_equal(open_, open_.T)
    np.testing.assert_array_equal(mask_patterns.locality_pattern(5, radius=0), np.eye(25, dtype=bool))
    assert mask_patterns.locality_pattern(5, radius=4).all()


def test_locality_cls_policies_and_bad_input():
    with_cls = mask_patterns.locality_pattern(3, 1, "open")
    assert with_cls.shape == (10, 10) and with_cls[0].all() and with_cls[:, 0].all()
    np.testing.assert_array_equal(with_cls[1:, 1:], mask_patterns.locality_pattern(3, 1))
    alone = mask_patterns.locality_pattern(3, 1, "self")
    assert alone[0].sum() == 1 and alone[1:, 0].sum() == 0
    with pytest.raises(ValueError, match="radius"):
        mask_patterns.locality_pattern(3, -1)
    with pytest.raises(ValueError, match="CLS policy"):
        mask_patterns.locality_pattern(3, 1, "everywhere")


def test_random_rows_keep_each_rows_count_and_the_diagonal():
    reference = mask_patterns.locality_pattern(4, 1)
    placebo = mask_patterns.random_rows(reference, seed=3)
    np.testing.assert_array_equal(placebo.sum(1), reference.sum(1))
    assert placebo.diagonal().all() and not np.array_equal(placebo, reference)
    np.testing.assert_array_equal(placebo, mask_patterns.random_rows(reference, seed=3))


def test_read_idx_round_trip_and_errors(tmp_path):
    array = np.arange(24, dtype=np.uint8).reshape(2, 3, 4)
    write_idx(tmp_path / "a.gz", array)
    write_idx(tmp_path / "b", array, compress=False)
    np.testing.assert_array_equal(images.read_idx(tmp_path / "a.gz"), array)
    np.testing.assert_array_equal(images.read_idx(tmp_path / "b"), array)
    (tmp_path / "bad").write_bytes(b"\x01\x02\x03\x04")
    with pytest.raises(ValueError, match="magic"):
        images.read_idx(tmp_path / "bad")
    (tmp_path / "short").write_bytes((tmp_path / "b").read_bytes()[:-3])
    with pytest.raises(ValueError, match="promises"):
        images.read_idx(tmp_path / "short")
    with pytest.raises(FileNotFoundError):
        images.read_idx(tmp_path / "missing")


def test_fashion_mnist_loader_on_a_tiny_folder(tiny_fashion, tmp_path):
    data = images.load("fashion_mnist", tiny_fashion)
    assert data.train_images.shape == (40, 28, 28, 1) and data.test_images.shape == (16, 28, 28, 1)
    assert data.train_labels.dtype == np.int32 and data.num_classes == 10
    with pytest.raises(FileNotFoundError, match="dataset-fashion-mnist"):
        images.load("fashion_mnist", tmp_path / "nowhere")


def test_cifar_loaders_read_the_python_pickles(tmp_path):
    rng = np.random.default_rng(0)
    c10 = tmp_path / "cifar-10-batches-py"
    c10.mkdir()
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        batch = {b"data": rng.integers(0, 256, (3, 3072), dtype=np.uint8), b"labels": [1, 2, 3]}
        (c10 / name).write_bytes(pickle.dumps(batch))
    data = images.load("cifar10", tmp_path)
    assert data.train_images.shape == (15, 32, 32, 3) and data.test_images.shape == (3, 32, 32, 3)
    first = pickle.loads((c10 / "data_batch_1").read_bytes())[b"data"][0]
    np.testing.assert_array_equal(data.train_images[0, :, :, 0].ravel(), first[:1024])  # red plane first
    c100 = tmp_path / "c100"
    c100.mkdir()
    for name in ("train", "test"):
        batch = {b"data": rng.integers(0, 256, (2, 3072), dtype=np.uint8), b"fine_labels": [7, 99]}
        (c100 / name).write_bytes(pickle.dumps(batch))
    data = images.load("cifar100", c100)
    assert data.num_classes == 100 and list(data.test_labels) == [7, 99]
    with pytest.raises(FileNotFoundError):
        images.load("cifar10", tmp_path / "empty")


def test_cifar_through_tfds_mock_data():
    tfds = pytest.importorskip("tensorflow_datasets")
    with tfds.testing.mock_data(num_examples=6):
        data = images.load_cifar("cifar10")
    assert data.train_images.shape == (6, 32, 32, 3) and data.train_images.dtype == np.uint8
    assert data.test_labels.dtype == np.int32 and data.num_classes == 10


def test_cifar_through_tfds_prepared_from_binary_files(tmp_path):
    """The real route: tfds's own cifar10 builder prepares fake CIFAR binary files (download_and_extract
    patched to the folder), then the loader reads them, split sizes known, as after a real download."""
    from unittest import mock

    tfds = pytest.importorskip("tensorflow_datasets")
    src = tmp_path / "extracted" / "cifar-10-batches-bin"
    src.mkdir(parents=True)
    rng = np.random.default_rng(0)
    written = {}
    for name, n in [(f"data_batch_{i}.bin", 2) for i in range(1, 6)] + [("test_batch.bin", 3)]:
        labels, pixels = rng.integers(0, 10, n, dtype=np.uint8), rng.integers(0, 256, (n, 3072), dtype=np.uint8)
        (src / name).write_bytes(np.concatenate([labels[:, None], pixels], 1).tobytes())
        written.update({bytes(p): int(lab) for lab, p in zip(labels, pixels, strict=True)})
    (src / "batches.meta.txt").write_text("\n".join(f"c{i}" for i in range(10)) + "\n")
    with mock.patch.object(tfds.download.DownloadManager, "download_and_extract", return_value=str(src.parent)):
        tfds.builder("cifar10", data_dir=tmp_path / "tfds").download_and_prepare()
    data = images._load_tfds("cifar10", 10, data_dir=tmp_path / "tfds")
    assert data.train_images.shape == (10, 32, 32, 3) and data.test_images.shape == (3, 32, 32, 3)
    for image, label in zip(data.train_images, data.train_labels, strict=True):  # tfds shuffles; match by content
        assert written[image.transpose(2, 0, 1).tobytes()] == label


def test_image_folder_loader(tmp_path):
    from PIL import Image

    for part in ("train", "val"):
        for cls in ("n01", "n02"):
            (tmp_path / part / cls).mkdir(parents=True)
            Image.new("RGB", (20, 12), (10, 20, 30)).save(tmp_path / part / cls / "x.png")
    data = images.load("imagenet100", tmp_path, image_size=16)
    assert data.train_images.shape == (2, 16, 16, 3) and list(data.train_labels) == [0, 1]
    assert data.num_classes == 2 and data.train_images[0, 0, 0].tolist() == [10, 20, 30]


def test_augmentation_is_deterministic_per_key_and_only_moves_pixels():
    batch = jnp.asarray(np.random.default_rng(0).integers(0, 256, (4, 8, 8, 1)), jnp.uint8)
    a = vt.augment(jax.random.key(1), batch, pad=2, flip=True)
    chex.assert_trees_all_equal(a, vt.augment(jax.random.key(1), batch, pad=2, flip=True))
    assert not np.array_equal(a, vt.augment(jax.random.key(2), batch, pad=2, flip=True))
    chex.assert_shape(a, batch.shape)
    chex.assert_trees_all_equal(vt.augment(jax.random.key(1), batch, pad=0, flip=False), batch)
    flipped = vt.augment(jax.random.key(1), batch, pad=0, flip=True)
    for original, out in zip(np.asarray(batch), np.asarray(flipped), strict=True):
        assert np.array_equal(out, original) or np.array_equal(out, original[:, ::-1])


def test_balanced_subset():
    labels = np.repeat(np.arange(5), 20)
    subset = vt.balanced_subset(labels, 0.1, seed=0)
    assert np.bincount(labels[subset]).tolist() == [2] * 5
    np.testing.assert_array_equal(subset, vt.balanced_subset(labels, 0.1, seed=0))
    assert not np.array_equal(subset, vt.balanced_subset(labels, 0.1, seed=1))
    assert len(vt.balanced_subset(labels, 1.0, seed=0)) == 100


def test_vit_shapes_pooling_and_zero_head():
    config = ModelConfig(dim=16, depth=2, heads=2, head_dim=8, mlp_dim=16)
    x = jnp.ones((3, 8, 8, 1))
    for pool, tokens in (("gap", 16), ("cls", 17)):
        model = ViT(5, 8, 2, config, "learnable", jnp.zeros((tokens, tokens)), pool=pool)
        variables = model.init(jax.random.key(0), x)
        chex.assert_shape(variables["params"]["pos_embed"], (tokens, 16))
        chex.assert_shape(variables["params"]["block_0"]["attn"]["mask_logits"], (2, tokens, tokens))
        logits = model.apply(variables, x)
        chex.assert_shape(logits, (3, 5))
        np.testing.assert_array_equal(logits, 0.0)
    with pytest.raises(ValueError, match="does not divide"):
        ViT(5, 8, 3, config).init(jax.random.key(0), x)


def test_impulse_targets_are_shifted_identities():
    data = images.ImageData("fashion_mnist", *(np.zeros((8, 8, 8, 1), np.uint8), np.zeros(8, np.int32)) * 2, 10)
    config = study.STUDY.preset("test")
    task = study.make_task(data, config)
    assert task.grid == 2 and task.tokens == 4
    pattern, target = study.qk_target(task, get_method("impulse"), config)
    chex.assert_shape(pattern, (2, 4, 4))
    np.testing.assert_allclose(target.sum(-1), 1.0)
    # head 0 is the identity (centre offset); head 1 looks one row up, and the top row, whose shift
    # leaves the zero-padded grid, has no open entry and a uniform target
    np.testing.assert_array_equal(pattern[0], np.eye(4, dtype=bool))
    assert pattern[1][2, 0] and not pattern[1][0].any()
    np.testing.assert_allclose(target[1][0], 0.25)


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--dataset=mnist"], "invalid choice"),
        (["--data-dir=/nonexistent/folder"], "dataset-fashion-mnist"),
        (["--patch-size=5"], "does not divide"),
        (["--radius=-1"], "radius"),
        (["--methods=qk_opt"], "not defined for the vision study"),
        (["--seeds=0"], "at least one seed"),
        (["--open=nan"], "finite"),
        (["--set", "epochs=ten"], "epochs expects an integer"),
    ],
)
def test_cli_bad_input_exits_2_in_one_line(main, tmp_path, tiny_fashion, flags, message):
    args = [f"--data-dir={tiny_fashion}", "--preset=test", f"--out={tmp_path / 'out'}", *flags]
    result = main("experiments.vision", *args)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr and "Traceback" not in result.stderr


def test_cli_end_to_end_and_batch_equals_alone(cli, tmp_path, tiny_fashion):
    common = [f"--data-dir={tiny_fashion}", "--preset=test"]
    out = tmp_path / "run"
    result = cli(
        "experiments.vision", *common, "--train-fraction=0.5,1", "--seeds=2", "--methods=mask,impulse", f"--out={out}"
    )
    assert result.returncode == 0, result.stderr
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert len(records) == 2 * 2 * 2
    for r in records:
        assert 0 <= r["test_acc"] <= 1 and r["git_commit"] and r["config"]["study"] == "vision"
        assert len(r["test_acc_probe"]) == len(r["drift_steps"]) == 3
    mask = next(r for r in records if r["method"] == "mask")
    assert len(mask["mask_sign_kept"][-1]) == 1 and 0 <= mask["mask_sign_kept"][-1][0] <= 1
    for r in records:  # [probes][layers]; the +10 / -10 mask starts with little weight outside its 3 x 3 window
        assert np.asarray(r["attention_outside_window"]).shape == (3, 1)
        assert 0 <= min(min(r["attention_outside_window"])) and max(max(r["attention_outside_window"])) <= 1
    assert mask["attention_outside_window"][0][0] < 0.1
    assert {r["n_train"] for r in records} == {20, 40}
    for png in ("curves_fashion_mnist_0.5.png", "attention_fashion_mnist_1.png", "mask_fashion_mnist_1_mask.png"):
        assert (out / png).read_bytes()[:4] == b"\x89PNG"
    assert "mask against each method, paired by seed" in (out / "summary.md").read_text()
    assert_matches_golden(records, "vision")  # pinned before the study interface moves (issue 30)
    alone = tmp_path / "alone"
    result = cli("experiments.vision", *common, "--train-fraction=0.5", "--seeds=1", "--methods=mask", f"--out={alone}")
    assert result.returncode == 0, result.stderr
    for single in (json.loads(line) for line in (alone / "results.jsonl").read_text().splitlines()):
        batched = next(
            r for r in records if (r["method"], r["seed"], r["train_fraction"]) == ("mask", 0, single["train_fraction"])
        )
        np.testing.assert_allclose(single["test_loss"], batched["test_loss"], rtol=1e-5)
        np.testing.assert_allclose(single["test_acc_probe"], batched["test_acc_probe"], atol=1e-6)


def test_softmax_regression_separates_separable_classes_and_its_cli_writes_records(cli, tmp_path, tiny_fashion):
    rng = np.random.default_rng(0)
    labels = np.repeat(np.arange(2), 20)
    pixels = np.where(labels[:, None, None, None] == 1, 200, 20) + rng.integers(0, 30, (40, 4, 4, 1))
    acc, loss = vt.softmax_regression_accuracy(pixels.astype(np.uint8), labels, pixels.astype(np.uint8), labels, 2)
    assert acc == 1.0 and loss < 0.1
    out = tmp_path / "linear"
    result = cli(
        "experiments.vision_linear", f"--data-dir={tiny_fashion}", "--train-fraction=0.5,1", "--seeds=2", f"--out={out}"
    )
    assert result.returncode == 0, result.stderr
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert [(r["train_fraction"], r["seed"]) for r in records] == [(0.5, 0), (0.5, 1), (1.0, 0)]
    assert all(0 <= r["test_acc"] <= 1 and r["git_commit"] and r["devices"] for r in records)
    summary = (out / "summary.md").read_text()
    assert summary.count("| fashion_mnist |") == 3 and "over 2 subset(s)" in summary


def test_patch_stem_is_the_strided_convolution_it_replaces():
    """Same parameters (names, shapes, initial values) as flax's nn.Conv with stride = kernel, and its outputs
    against a float64 numpy convolution."""
    from flax import linen as nn

    from maskjax.models.vit import PatchEmbed

    pictures = jax.random.normal(jax.random.key(1), (3, 8, 8, 3))
    variables = nn.Conv(16, (4, 4), strides=(4, 4), padding="VALID").init(jax.random.key(0), pictures)
    chex.assert_trees_all_equal(PatchEmbed(16, 4).init(jax.random.key(0), pictures), variables)
    x, kernel = np.asarray(pictures, np.float64), np.asarray(variables["params"]["kernel"], np.float64)
    expected = np.stack(
        [
            np.einsum("bijc,ijcd->bd", x[:, 4 * r : 4 * r + 4, 4 * c : 4 * c + 4], kernel)
            for r in range(2)
            for c in range(2)
        ],
        axis=1,
    ) + np.asarray(variables["params"]["bias"], np.float64)
    np.testing.assert_allclose(np.asarray(PatchEmbed(16, 4).apply(variables, pictures)), expected, rtol=1e-5, atol=1e-5)


def test_a_test_split_that_eval_batch_does_not_divide_is_scored_whole(tiny_fashion):
    """16 test images in chunks of 5 (the last one filled with weight 0) score as one chunk of 16."""
    data = images.load("fashion_mnist", tiny_fashion)
    config = study.STUDY.preset("test")
    records = {
        size: study.STUDY.run(
            dataclasses.replace(config, eval_batch=size), study.VisionGroup(data, 1.0, get_method("mask")), [0]
        )[0]
        for size in (5, 16)
    }
    for key in ("test_acc", "test_loss"):
        assert records[5][0][key] == pytest.approx(records[16][0][key], rel=1e-5), key
    assert records[5][0]["train_loss"] == records[16][0]["train_loss"]


def test_eval_chunks_fill_the_last_chunk_and_mark_the_filler():
    from maskjax.runs import eval_chunks

    (x, y), weights = eval_chunks([np.arange(7.0), np.arange(7) * 10], 3)
    chex.assert_shape([x, y, weights], (3, 3))
    np.testing.assert_array_equal(np.asarray(x).ravel(), [0, 1, 2, 3, 4, 5, 6, 6, 6])
    np.testing.assert_array_equal(np.asarray(weights).ravel(), [1, 1, 1, 1, 1, 1, 1, 0, 0])
    (whole,), none = eval_chunks([np.arange(6.0)], 3)
    assert none is None and whole.shape == (2, 3)
    (small,), _ = eval_chunks([np.arange(2.0)], 8)
    assert small.shape == (1, 2)


def test_the_medium_preset_is_the_rung_the_ladder_passed():
    """docs/results/vision_ladder.md names `medium`; its config is that run's, field for field (a field added
    since, impulse_position_scale, at its default)."""
    from maskjax.runner import field_defaults, without_added

    ran = json.loads((Path(__file__).parent.parent / "docs/results/vision_ladder/v64d4p7e30/config.json").read_text())
    preset = study.STUDY.preset("medium")
    medium = dataclasses.asdict(preset)
    assert {k for k in medium if k not in ran} == {"impulse_position_scale"}
    assert set(medium["model"]) - set(ran["model"]) == {"attention_impl"}  # issue 48, at its default
    kept = without_added(json.loads(json.dumps(medium)), ran, field_defaults(preset))
    assert {k: v for k, v in kept.items() if k != "preset"} == {k: ran[k] for k in kept if k != "preset"}


def test_impulse_position_scale_multiplies_the_positions_its_prior_is_built_on(tiny_fashion):
    """Issue 44's sensitivity check: impulse at position scale 1 as well as the published 18."""
    data = images.load("fashion_mnist", tiny_fashion)
    config, key = study.STUDY.preset("test"), jax.random.key(2)

    def init(method: str, **fields) -> dict:
        inputs = study.make_group(
            study.VisionGroup(data, 1.0, get_method(method)), [0], dataclasses.replace(config, **fields)
        ).inputs
        return inputs.init_run(key, *(a[0] for a in inputs.run_inputs))[0]

    plain = init("vanilla")
    for scale in (1.0, 18.0):
        params = init("impulse", impulse_position_scale=scale)
        np.testing.assert_allclose(params["pos_embed"], scale * plain["pos_embed"], rtol=1e-6)
    assert config.impulse_position_scale == 18.0
