import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from maskjax.optim import TrainConfig, make_optimizer
from maskjax.train import compile_program

PARAMS = {"block_0": {"attn": {"mask_logits": jnp.full((2, 3, 3), 10.0), "w": jnp.full((3,), 2.0)}}}


def step(config: TrainConfig, params: dict, grads: dict, state=None):
    optimizer = make_optimizer(config)
    state = optimizer.init(params) if state is None else state
    updates, state = optimizer.update(grads, state, params)
    return optax.apply_updates(params, updates), state


@pytest.mark.parametrize("name", ["adam", "adamw", "sgd"])
def test_mask_weight_decay_zero_leaves_the_mask_to_its_gradient(name):
    zero = jax.tree.map(jnp.zeros_like, PARAMS)
    config = TrainConfig(steps=10, learning_rate=0.1, weight_decay=0.1, optimizer=name, mask_weight_decay=0.0)
    new, _ = step(config, PARAMS, zero)
    np.testing.assert_array_equal(new["block_0"]["attn"]["mask_logits"], PARAMS["block_0"]["attn"]["mask_logits"])
    assert np.all(np.asarray(new["block_0"]["attn"]["w"]) < 2.0)
    decayed, _ = step(TrainConfig(steps=10, learning_rate=0.1, weight_decay=0.1, optimizer=name), PARAMS, zero)
    assert np.all(np.asarray(decayed["block_0"]["attn"]["mask_logits"]) < 10.0)


def test_the_default_adam_is_the_papers_adam_with_l2_exactly():
    grads = jax.tree.map(lambda a: 0.3 * jnp.ones_like(a), PARAMS)
    config = TrainConfig(steps=10, learning_rate=1e-3, weight_decay=1e-3)
    reference = optax.chain(optax.add_decayed_weights(1e-3), optax.adam(1e-3))
    updates, _ = reference.update(grads, reference.init(PARAMS), PARAMS)
    ours, _ = step(config, PARAMS, grads)
    jax.tree.map(np.testing.assert_array_equal, ours, optax.apply_updates(PARAMS, updates))


def test_sgd_is_torch_sgd_with_momentum_and_l2():
    """p <- p - lr * v, v <- 0.9 v + g + wd p (torch.optim.SGD), two steps in float64 numpy."""
    lr, wd = 0.05, 0.01
    params = {"w": jnp.asarray([1.0, -2.0])}
    config = TrainConfig(steps=2, learning_rate=lr, weight_decay=wd, optimizer="sgd")
    p, v, state = np.array([1.0, -2.0]), np.zeros(2), None
    for g in ([0.5, 0.25], [-1.0, 2.0]):
        params, state = step(config, params, {"w": jnp.asarray(g)}, state)
        v = 0.9 * v + np.asarray(g) + wd * p
        p = p - lr * v
        np.testing.assert_allclose(np.asarray(params["w"]), p, rtol=1e-6)


def test_an_unknown_optimizer_and_a_negative_mask_decay_are_refused():
    with pytest.raises(ValueError, match="unknown optimizer 'rmsprop'"):
        make_optimizer(TrainConfig(steps=1, optimizer="rmsprop"))
    with pytest.raises(ValueError, match="mask weight decay"):
        make_optimizer(TrainConfig(steps=1, mask_weight_decay=-1.0))


def test_one_chunk_program_serves_every_chunk_length_with_the_same_floats():
    x = jnp.linspace(-1, 1, 64)[:, None]
    data = (x, 3.0 * x[:, 0])

    def init_run(key):
        return {"w": jax.random.normal(key, (1,))}, {}

    def loss(params, constants, batch):
        return jnp.mean((batch[0][:, 0] * params["w"][0] - batch[1]) ** 2)

    keys = jax.vmap(jax.random.key)(jnp.arange(2, dtype=jnp.uint32))
    finals = []
    for chunk_steps in (5, 12):
        program = compile_program(init_run, loss, 64, TrainConfig(steps=12, batch_size=8, chunk_steps=chunk_steps))
        state = program.init(keys)
        for start in range(0, 12, chunk_steps):
            state, losses = program.chunk(state, data, jnp.asarray(start), jnp.asarray(min(chunk_steps, 12 - start)))
        assert program.chunk._cache_size() == 1
        finals.append(np.asarray(state.params["w"]))
    np.testing.assert_array_equal(finals[0], finals[1])


def test_warmup_then_cosine_and_gradient_clipping_against_numpy():
    """SGD (no momentum effect on the first step) makes the schedule and the clip readable in the update:
    step 0 of a warmup from 0 moves nothing; a gradient of norm 5 clipped to 1 moves lr * g / 5."""
    params = {"w": jnp.zeros(2)}
    grads = {"w": jnp.asarray([3.0, 4.0])}
    warm = TrainConfig(
        steps=10, learning_rate=0.1, weight_decay=0.0, optimizer="sgd", schedule="cosine", warmup_steps=4
    )
    new, _ = step(warm, params, grads)
    np.testing.assert_array_equal(new["w"], 0.0)
    clipped = TrainConfig(steps=10, learning_rate=0.1, weight_decay=0.0, optimizer="sgd", clip_norm=1.0)
    new, _ = step(clipped, params, grads)
    np.testing.assert_allclose(new["w"], -0.1 * np.array([3.0, 4.0]) / 5.0, rtol=1e-6)
    unclipped = TrainConfig(steps=10, learning_rate=0.1, weight_decay=0.0, optimizer="sgd")
    new, _ = step(unclipped, params, grads)
    np.testing.assert_allclose(new["w"], -0.1 * np.array([3.0, 4.0]), rtol=1e-6)
