import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import maskjax
from maskjax.attention import MaskedSelfAttention, NNXMaskedSelfAttention


def numpy_attention(q, k, v, m, scale=1.0):
    """float64 reference: softmax(q.k/sqrt(d) + log_sigmoid(scale*m)) v, layout [B, L, H, D]."""
    d = q.shape[-1]
    logits = np.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(d) - np.log1p(np.exp(-scale * m))
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return np.einsum("bhqk,bkhd->bqhd", p, v), p


def random_inputs(seed=0, b=2, length=5, heads=3, d=4):
    rng = np.random.default_rng(seed)
    q, k, v = (rng.normal(size=(b, length, heads, d)) for _ in range(3))
    m = rng.normal(scale=3.0, size=(heads, length, length))
    return q, k, v, m


def test_forward_matches_float64_reference():
    q, k, v, m = random_inputs()
    expected, _ = numpy_attention(q, k, v, m, scale=0.7)
    with jax.enable_x64(True):
        out = maskjax.masked_attention(*map(jnp.asarray, (q, k, v, m)), mask_scale=0.7)
        assert out.dtype == jnp.float64
        np.testing.assert_allclose(np.asarray(out), expected, rtol=1e-12, atol=1e-12)
    out32 = maskjax.masked_attention(*(jnp.asarray(a, jnp.float32) for a in (q, k, v, m)), mask_scale=0.7)
    assert out32.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(out32), expected, rtol=1e-4, atol=1e-5)


def test_no_mask_is_plain_attention_and_mask_broadcasts():
    q, k, v, m = random_inputs()
    q, k, v = map(jnp.asarray, (q, k, v))
    plain = maskjax.masked_attention(q, k, v)
    expected, _ = numpy_attention(*map(np.asarray, (q, k, v)), np.full(m.shape, 50.0))
    np.testing.assert_allclose(np.asarray(plain), expected, rtol=1e-4, atol=1e-5)
    shared = maskjax.masked_attention(q, k, v, jnp.asarray(m[0]))
    per_head = maskjax.masked_attention(q, k, v, jnp.broadcast_to(jnp.asarray(m[0]), m.shape))
    chex.assert_trees_all_close(shared, per_head)
    chex.assert_shape(shared, q.shape)


def test_gradient_matches_closed_form_and_bound():
    """d p_i / d m_j = p_i (delta_ij - p_j) sigmoid(-m_j), and |d p_i / d m_j| <= p_i."""
    q, k, _, m = random_inputs(seed=1, b=1, heads=1)
    with jax.enable_x64(True):

        def probs(mask):
            return maskjax.attention_weights(jnp.asarray(q), jnp.asarray(k), mask)[0, 0, 0]

        jac = np.asarray(jax.jacobian(probs)(jnp.asarray(m)))[:, 0, 0, :]  # [i, j] for query row 0
    _, p = numpy_attention(q, k, q, m)
    p0, m0 = p[0, 0, 0], m[0, 0]
    expected = p0[:, None] * (np.eye(len(p0)) - p0[None, :]) * (1 / (1 + np.exp(m0)))[None, :]
    np.testing.assert_allclose(jac, expected, rtol=1e-10, atol=1e-14)
    assert np.all(np.abs(jac) <= p0[:, None] + 1e-15)


@pytest.mark.parametrize("shape", [(3, 5, 4), (2, 5, 5), (5, 6)])
def test_wrong_mask_shape_names_the_shape(shape):
    q, k, v, _ = random_inputs()
    with pytest.raises(ValueError, match=r"shape \(" + ", ".join(map(str, shape))):
        maskjax.masked_attention(*map(jnp.asarray, (q, k, v)), jnp.zeros(shape))


def test_nan_mask_is_rejected():
    q, k, v, m = random_inputs()
    m[0, 1, 2] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        maskjax.masked_attention(*map(jnp.asarray, (q, k, v)), jnp.asarray(m))


@pytest.mark.parametrize("mode", ["none", "learnable", "fixed"])
def test_linen_and_nnx_agree(mode):
    heads, head_dim, length, features = 2, 4, 6, 8
    pattern = np.where(np.eye(length, dtype=bool), 5.0, -5.0)
    x = jax.random.normal(jax.random.key(0), (3, length, features))
    linen = MaskedSelfAttention(heads, head_dim, mask_mode=mode, mask_init=pattern)
    variables = linen.init(jax.random.key(1), x)
    twin = NNXMaskedSelfAttention(
        features, heads, head_dim, length, mask_mode=mode, mask_init=pattern, rngs=nnx.Rngs(2)
    )
    params = variables["params"]
    twin.qkv.kernel[...] = params["qkv"]["kernel"]
    twin.out.kernel[...] = params["out"]["kernel"]
    twin.out.bias[...] = params["out"]["bias"]
    if mode == "learnable":
        chex.assert_trees_all_close(twin.mask_logits[...], params["mask_logits"])
    if mode == "fixed":
        assert "mask_logits" not in params
        chex.assert_trees_all_close(twin.mask_logits[...], variables["constants"]["mask_logits"])
        assert not isinstance(twin.mask_logits, nnx.Param)
    chex.assert_trees_all_close(linen.apply(variables, x), twin(x), rtol=1e-6, atol=1e-6)


def test_fixed_mask_gets_no_update_and_learnable_mask_does():
    length, features = 4, 8
    pattern = np.where(np.eye(length, dtype=bool), 2.0, -2.0)
    x = jax.random.normal(jax.random.key(0), (2, length, features))
    for mode in ("fixed", "learnable"):
        module = MaskedSelfAttention(2, 4, mask_mode=mode, mask_init=pattern)
        variables = module.init(jax.random.key(1), x)
        optimizer = optax.adam(1e-1)
        params = variables["params"]
        opt_state = optimizer.init(params)
        rest = {k: v for k, v in variables.items() if k != "params"}

        def loss(p, module=module, rest=rest):
            return jnp.sum(module.apply({"params": p, **rest}, x) ** 2)

        for _ in range(3):
            updates, opt_state = optimizer.update(jax.grad(loss)(params), opt_state)
            params = optax.apply_updates(params, updates)
        if mode == "fixed":
            np.testing.assert_array_equal(np.asarray(rest["constants"]["mask_logits"][0]), pattern)
            assert "mask_logits" not in params
        else:
            assert not np.allclose(np.asarray(params["mask_logits"][0]), pattern)


def test_bfloat16_projections_keep_a_float32_softmax_and_stay_close():
    q, k, v, m = random_inputs(seed=3)
    expected, _ = numpy_attention(q, k, v, m)
    q16, k16, v16 = (jnp.asarray(a, jnp.bfloat16) for a in (q, k, v))
    weights = maskjax.attention_weights(q16, k16, jnp.asarray(m, jnp.float32))
    assert weights.dtype == jnp.float32
    out = maskjax.masked_attention(q16, k16, v16, jnp.asarray(m, jnp.float32))
    assert out.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(out, np.float64), expected, rtol=5e-2, atol=5e-2)


def test_module_in_bfloat16_keeps_float32_parameters_and_output():
    x = jax.random.normal(jax.random.key(0), (2, 6, 8))
    prior = jnp.where(jnp.eye(6, dtype=bool), 10.0, -10.0)
    full = MaskedSelfAttention(2, 4, mask_mode="learnable", mask_init=prior)
    half = MaskedSelfAttention(2, 4, mask_mode="learnable", mask_init=prior, dtype=jnp.bfloat16)
    variables = full.init(jax.random.key(1), x)
    assert all(leaf.dtype == jnp.float32 for leaf in jax.tree.leaves(half.init(jax.random.key(1), x)))
    out = half.apply(variables, x)
    assert out.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(out), np.asarray(full.apply(variables, x)), atol=5e-2)


def test_qk_norm_applies_layer_norm_to_queries_and_keys():
    x = jax.random.normal(jax.random.key(0), (2, 5, 8))
    layer = MaskedSelfAttention(2, 4, qk_norm=True)
    variables = layer.init(jax.random.key(1), x)
    assert set(variables["params"]) == {"qkv", "out", "q_norm", "k_norm"}
    _, sown = layer.apply(variables, x, mutable=["intermediates"])
    (logits,) = sown["intermediates"]["qk_logits"]
    kernel = np.asarray(variables["params"]["qkv"]["kernel"], np.float64)
    q, k = (np.einsum("bld,dhe->blhe", np.asarray(x, np.float64), kernel[:, i]) for i in (0, 1))
    q, k = (numpy_layer_norm(a) for a in (q, k))
    expected = np.einsum("bqhe,bkhe->bhqk", q, k) / 2.0
    np.testing.assert_allclose(np.asarray(logits), expected, rtol=1e-4, atol=1e-4)
    scaled = jax.tree.map(lambda a: a, variables)
    scaled["params"]["qkv"]["kernel"] = variables["params"]["qkv"]["kernel"].at[:, 0].multiply(10.0)
    np.testing.assert_allclose(layer.apply(scaled, x), layer.apply(variables, x), rtol=1e-4, atol=1e-4)


def numpy_layer_norm(a):
    return (a - a.mean(-1, keepdims=True)) / np.sqrt(a.var(-1, keepdims=True) + 1e-5)
