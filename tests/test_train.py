import dataclasses
import os
import subprocess
import sys

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import ROOT

from maskjax.methods import get_method
from maskjax.optim import TrainConfig
from maskjax.studies import boolean as study
from maskjax.tables import summary_table
from maskjax.tasks.boolean import get_task
from maskjax.train import TrainInputs, epoch_orders, first_nonfinite_step, train

CONFIG = dataclasses.replace(study.STUDY.preset("test"), steps=12, chunk_steps=5)
COMPARED = ("acc_all", "acc_unseen", "mse", "train_loss")


def test_a_run_in_a_batch_of_8_equals_the_run_alone():
    task, method = get_task("2parity"), get_method("mask")
    batch, _ = study.STUDY.run(CONFIG, study.BooleanGroup(task, method), list(range(8)))
    alone, _ = study.STUDY.run(CONFIG, study.BooleanGroup(task, method), [5])
    for key in COMPARED:
        assert alone[0][key] == pytest.approx(batch[5][key], rel=1e-4, abs=1e-6), key
    assert batch[5]["runs_in_batch"] == 8 and alone[0]["runs_in_batch"] == 1


def test_same_seed_same_result_and_seeds_differ():
    task, method = get_task("majority3"), get_method("vanilla")
    first, _ = study.STUDY.run(CONFIG, study.BooleanGroup(task, method), [0, 1])
    again, _ = study.STUDY.run(CONFIG, study.BooleanGroup(task, method), [0, 1])
    assert [r["mse"] for r in first] == [r["mse"] for r in again]
    assert first[0]["mse"] != first[1]["mse"]


def test_epoch_orders_are_permutations_and_differ_per_epoch():
    orders = np.asarray(epoch_orders(jax.random.key(0), jnp.asarray(3), 2, 50))
    chex.assert_shape(orders, (2, 50))
    for order in orders:
        np.testing.assert_array_equal(np.sort(order), np.arange(50))
    assert not np.array_equal(orders[0], orders[1])
    np.testing.assert_array_equal(np.asarray(epoch_orders(jax.random.key(0), jnp.asarray(4), 1, 50))[0], orders[1])


def test_train_fits_a_linear_model_and_stacks_runs():
    x = jnp.linspace(-1, 1, 64)[:, None]
    y = 3.0 * x[:, 0]

    def init_run(key, scale):
        return {"w": scale * jax.random.normal(key, (1,))}, {}

    def loss(params, constants, batch):
        xb, yb = batch
        return jnp.mean((xb[:, 0] * params["w"][0] - yb) ** 2)

    config = TrainConfig(steps=300, batch_size=16, learning_rate=0.05, weight_decay=0.0, chunk_steps=64)
    keys = jax.vmap(jax.random.key)(jnp.arange(3, dtype=jnp.uint32))
    initial, final, history, *_ = train(TrainInputs(init_run, loss, keys, (jnp.ones(3),), (x, y), config))
    chex.assert_shape(final.params["w"], (3, 1))
    chex.assert_shape(history, (3, 300))
    np.testing.assert_allclose(np.asarray(final.params["w"][:, 0]), 3.0, atol=1e-2)
    assert not np.allclose(np.asarray(initial.params["w"]), np.asarray(final.params["w"]))


def test_train_rejects_a_batch_larger_than_the_data():
    config = TrainConfig(steps=1, batch_size=128)
    with pytest.raises(ValueError, match="smaller than batch size"):
        train(
            TrainInputs(
                lambda k: ({}, {}),
                lambda p, c, b: 0.0,
                jax.random.split(jax.random.key(0), 1),
                (),
                jnp.ones((4, 1)),
                config,
            )
        )


def test_a_diverged_run_is_found_and_leaves_the_others_alone():
    x = jnp.linspace(-1, 1, 32)[:, None]
    y = 2.0 * x[:, 0]

    def init_run(key, scale):
        return {"w": scale * jnp.ones((1,))}, {}

    def loss(params, constants, batch):
        xb, yb = batch
        return jnp.mean((xb[:, 0] * params["w"][0] - yb) ** 2)

    config = TrainConfig(steps=20, batch_size=8, learning_rate=0.1, weight_decay=0.0, chunk_steps=7)
    keys = jax.vmap(jax.random.key)(jnp.arange(3, dtype=jnp.uint32))
    _, final, history, *_ = train(
        TrainInputs(init_run, loss, keys, (jnp.asarray([1.0, jnp.inf, 0.5]),), (x, y), config)
    )
    np.testing.assert_array_equal(first_nonfinite_step(history), [0, 1, 0])
    _, alone, alone_history, *_ = train(TrainInputs(init_run, loss, keys[2:], (jnp.asarray([0.5]),), (x, y), config))
    np.testing.assert_allclose(np.asarray(final.params["w"][2]), np.asarray(alone.params["w"][0]), rtol=1e-6)
    np.testing.assert_allclose(history[2], alone_history[0], rtol=1e-5, atol=1e-7)


def test_summary_counts_diverged_runs_instead_of_averaging_them():
    records = [
        {"task": "t", "method": "m", "seed": 0, "acc_all": 0.5, "diverged": False},
        {"task": "t", "method": "m", "seed": 1, "acc_all": 1.0, "diverged": False},
        {"task": "t", "method": "m", "seed": 2, "acc_all": None, "diverged": True},
    ]
    table = summary_table(records, ["acc_all"], ["task", "method"])
    assert "| t | m | 3 | 1 | 75.00 +- 35.36 |" in table


def test_drift_is_probed_at_init_and_every_chunk_and_a_fixed_mask_never_moves():
    task = get_task("2parity")
    (fixed,), _ = study.STUDY.run(CONFIG, study.BooleanGroup(task, get_method("mask_fixed")), [0])
    (learned,), _ = study.STUDY.run(CONFIG, study.BooleanGroup(task, get_method("mask")), [0])
    for r in (fixed, learned):
        assert r["drift_steps"] == [0, 5, 10, 12]
        chex.assert_shape(np.asarray(r["attention_drift"]), (4, CONFIG.model.depth))
        assert r["attention_drift"][0] == [0.0] and r["attention_drift"][-1][0] > 0
    assert all(step == [0.0] for step in fixed["prior_logit_drift"] + fixed["grad_norm_mask"])
    assert learned["prior_logit_drift"][-1][0] > 0 and learned["grad_norm_mask"][0][0] > 0
    assert fixed["grad_norm_qk"][0][0] > 0


def test_shared_data_is_one_global_array_replicated_on_every_device():
    code = (
        "import numpy as np, jax; from maskjax.sharding import replicate; "
        "x = replicate({'a': np.arange(6.0).reshape(2, 3)})['a']; "
        "assert len(x.sharding.device_set) == 8 and x.sharding.is_fully_replicated; "
        "np.testing.assert_array_equal(np.asarray(x), np.arange(6.0).reshape(2, 3)); print('ok')"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT), "XLA_FLAGS": "--xla_force_host_platform_device_count=8"}
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and "ok" in result.stdout, result.stderr
