import dataclasses

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from maskjax import probes
from maskjax.methods import get_method
from maskjax.studies import boolean as study
from maskjax.tasks.boolean import TASKS, cube, get_task, probe_points, seen_share

CONFIG = dataclasses.replace(study.STUDY.preset("test"), steps=12, chunk_steps=5)


def exercises_the_cube(x: np.ndarray, seen: np.ndarray) -> bool:
    """Every bit takes both values, and seen and unseen points are both present."""
    return bool(np.all((x == 1).any(0) & (x == -1).any(0)) and seen.any() and (~seen).any())


@pytest.mark.parametrize("name", sorted(TASKS))
@pytest.mark.parametrize("count", [study.PROBE_POINTS, study.MAP_POINTS])
def test_probe_points_vary_every_bit_and_hold_both_regions(name, count):
    task = get_task(name)
    x, seen = probe_points(task, count)
    chex.assert_shape(x, (count, task.n_bits))
    assert exercises_the_cube(x, seen)
    np.testing.assert_array_equal(seen, np.asarray(task.seen(x), bool))
    assert seen.sum() == count - count // 2
    assert len(np.unique(x, axis=0)) == count
    again_x, again_seen = probe_points(task, count)
    np.testing.assert_array_equal(x, again_x)
    np.testing.assert_array_equal(seen, again_seen)


def test_the_strided_probe_set_of_old_fails_the_check():
    """What the probes used up to a312d33: every k-th row of the cube, where the low bits never change."""
    task = get_task("2parity")
    points = cube(task.n_bits)
    for count in (64, 512):
        strided = points[:: points.shape[0] // count]
        assert not exercises_the_cube(strided, np.asarray(task.seen(strided), bool))


def test_probe_points_refuse_more_points_than_a_region_holds():
    with pytest.raises(ValueError, match="probe points"):
        probe_points(get_task("2parity"), 2**15)


def test_region_means_weight_each_region_by_its_share_of_the_cube():
    rng = np.random.default_rng(0)
    values = rng.normal(size=(10, 3))
    seen = np.array([True] * 6 + [False] * 4)
    out = probes.region_means(jnp.asarray(values, jnp.float32), jnp.asarray(seen), 0.75)
    seen_mean, unseen_mean = values[seen].mean(0), values[~seen].mean(0)
    np.testing.assert_allclose(out["seen"], seen_mean, rtol=1e-5)
    np.testing.assert_allclose(out["unseen"], unseen_mean, rtol=1e-5)
    np.testing.assert_allclose(out["all"], 0.75 * seen_mean + 0.25 * unseen_mean, rtol=1e-5)
    np.testing.assert_allclose(probes.region_weighted(values, seen, 0.75), out["all"], rtol=1e-5)


def test_mask_logit_change_splits_open_and_closed_entries():
    initial = np.array([[[10.0, -10.0], [-10.0, 10.0]], [[0.0, -5.0], [-5.0, -5.0]]])
    current = initial + np.array([[[0.5, -1.0], [3.0, 0.1]], [[-2.0, 0.0], [0.0, 1.0]]])
    out = {k: np.asarray(v) for k, v in probes.mask_logit_change(jnp.asarray(initial), jnp.asarray(current)).items()}
    np.testing.assert_allclose(out["mask_change_open_mean"], [0.3, 2.0], rtol=1e-6)
    np.testing.assert_allclose(out["mask_change_open_max"], [0.5, 2.0])
    np.testing.assert_allclose(out["mask_change_closed_mean"], [2.0, 1.0 / 3.0], rtol=1e-6)
    np.testing.assert_allclose(out["mask_change_closed_max"], [3.0, 1.0])
    none_closed = probes.mask_logit_change(jnp.zeros((1, 2, 2)), jnp.ones((1, 2, 2)))
    assert float(none_closed["mask_change_closed_mean"][0]) == 0.0


def test_outside_mass_is_the_attention_on_closed_keys_against_float64_numpy():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(3, 2, 4, 5, 5))  # layers, inputs, heads, queries, keys
    attention = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    open_QK = rng.random((5, 5)) < 0.4
    expected = np.zeros(3)
    for layer, b, h, q, k in np.ndindex(attention.shape):
        if not open_QK[q, k]:
            expected[layer] += attention[layer, b, h, q, k] / (2 * 4 * 5)
    got = probes.outside_mass(jnp.asarray(attention, jnp.float32), jnp.asarray(open_QK, jnp.float32))
    chex.assert_shape(got, (3,))
    np.testing.assert_allclose(np.asarray(got), expected, rtol=1e-5)
    all_open = probes.outside_mass(jnp.asarray(attention, jnp.float32), jnp.ones((5, 5)))
    np.testing.assert_array_equal(np.asarray(all_open), 0.0)


def test_drift_is_reported_per_region_and_the_mask_change_of_a_fixed_mask_is_zero():
    task = get_task("majority3")
    (fixed,), _ = study.STUDY.run(CONFIG, study.BooleanGroup(task, get_method("mask_fixed")), [0])
    (learned,), _ = study.STUDY.run(CONFIG, study.BooleanGroup(task, get_method("mask")), [0])
    share = seen_share(task)
    for r in (fixed, learned):
        end = [np.asarray(r[k][-1]) for k in ("attention_drift", "attention_drift_seen", "attention_drift_unseen")]
        np.testing.assert_allclose(end[0], share * end[1] + (1 - share) * end[2], rtol=1e-4, atol=1e-7)
        assert end[2][0] > 0
    assert all(v == [0.0] for k in probes.CHANGE_KEYS for v in fixed[k])
    assert learned["mask_change_open_mean"][-1][0] > 0 and learned["mask_change_closed_max"][-1][0] > 0


def test_the_gradient_probe_batches_are_distinct_training_points():
    task = get_task("2parity")
    data = study.make_group(study.BooleanGroup(task, get_method("vanilla")), [0], CONFIG).inputs.data
    x, y = study.probe_batches(data, 32)
    chex.assert_shape(x, (study.GRADIENT_BATCHES, 32, task.n_bits))
    for xb in np.asarray(x):
        assert len(np.unique(xb, axis=0)) == 32
        assert np.asarray(task.seen(xb), bool).all()
    assert not np.array_equal(np.asarray(x[0]), np.asarray(x[1]))
    chex.assert_trees_all_equal(study.probe_batches(data, 32), (x, y))
    assert jax.tree.leaves(y)[0].shape == (study.GRADIENT_BATCHES, 32)
