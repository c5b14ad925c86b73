"""The causal models' vocabulary read-out (issue 48): `torch_dense`'s parameters and numbers, a written kernel
gradient."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from maskjax.models.layers import Readout, readout, torch_dense


@settings(deadline=None, max_examples=10)
@given(lead=st.lists(st.integers(1, 4), min_size=1, max_size=3), dim=st.integers(1, 5), vocab=st.integers(1, 7))
def test_the_written_gradient_equals_numpy_in_float64(lead, dim, vocab):
    """For any leading shape: h @ W and its vjp, (g W^T, h^T g summed over every leading axis), in float64."""
    rng = np.random.default_rng([*lead, dim, vocab])
    h, w, g = rng.normal(size=(*lead, dim)), rng.normal(size=(dim, vocab)), rng.normal(size=(*lead, vocab))
    with jax.enable_x64(True):
        out, pull = jax.vjp(readout, jnp.asarray(h), jnp.asarray(w))
        grad_h, grad_w = pull(jnp.asarray(g))
    np.testing.assert_allclose(out, h @ w, rtol=1e-12)
    np.testing.assert_allclose(grad_h, g @ w.T, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(grad_w, h.reshape(-1, dim).T @ g.reshape(-1, vocab), rtol=1e-12, atol=1e-12)
    assert grad_h.dtype == grad_w.dtype == jnp.float64


def test_the_module_is_torch_dense_with_its_parameters_and_gradients_under_vmap():
    """Same parameter tree and initial values as `torch_dense` (checkpoints and golden records carry over), the
    same outputs, and the same gradients when vmapped over runs as training does."""
    h = jax.random.normal(jax.random.key(0), (2, 3, 5, 8))  # [runs, batch, length, dim]
    dense, head = torch_dense(11, 8, "head"), Readout(11, 8, name="head")
    variables = dense.init(jax.random.key(1), h[0])
    chex.assert_trees_all_equal(head.init(jax.random.key(1), h[0]), variables)
    chex.assert_trees_all_close(head.apply(variables, h[0]), dense.apply(variables, h[0]), rtol=1e-6, atol=1e-6)

    def grads(module):
        loss = lambda p, x: jnp.sum(jnp.tanh(module.apply({"params": p}, x)))  # noqa: E731
        return jax.vmap(jax.grad(loss), in_axes=(None, 0))(variables["params"], h)

    expected, got = grads(dense), grads(head)
    chex.assert_trees_all_equal_shapes(got, expected)
    chex.assert_trees_all_close(got, expected, rtol=1e-5, atol=1e-6)


def test_bfloat16_matmuls_keep_float32_parameters():
    head = Readout(6, 4, dtype="bfloat16")
    variables = head.init(jax.random.key(0), jnp.ones((2, 4)))
    out = head.apply(variables, jnp.ones((2, 4)))
    assert out.dtype == jnp.bfloat16 and variables["params"]["kernel"].dtype == jnp.float32
    grad = jax.grad(lambda p: jnp.sum(head.apply({"params": p}, jnp.ones((2, 4))).astype(jnp.float32)))(
        variables["params"]
    )
    assert grad["kernel"].dtype == jnp.float32
