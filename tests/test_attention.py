import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from hypothesis import given, settings
from hypothesis import strategies as st

import maskjax
from maskjax.attention import MaskedSelfAttention
from maskjax.nnx_modules import NNXMaskedSelfAttention


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


def test_nan_mask_is_rejected_on_the_host_and_at_init():
    q, k, v, m = random_inputs()
    m[0, 1, 2] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        maskjax.masked_attention(*map(jnp.asarray, (q, k, v)), m)
    x = jnp.zeros((2, 5, 8))
    for mode in ("learnable", "fixed"):
        with pytest.raises(ValueError, match="NaN"):
            MaskedSelfAttention(3, 4, mask_mode=mode, mask_init=jnp.asarray(m)).init(jax.random.key(0), x)


def test_an_eager_call_with_a_device_mask_copies_nothing_to_the_host():
    q, k, v, m = (jnp.asarray(a, jnp.float32) for a in random_inputs())
    with jax.transfer_guard_device_to_host("disallow"):
        out = maskjax.masked_attention(q, k, v, m)
    chex.assert_shape(out, q.shape)


def test_mask_init_of_the_wrong_length_names_both_shapes():
    x = jnp.zeros((2, 5, 8))
    with pytest.raises(ValueError, match=r"mask_init of shape \(6, 6\).*\[3, 5, 5\]"):
        MaskedSelfAttention(3, 4, mask_mode="learnable", mask_init=np.zeros((6, 6))).init(jax.random.key(0), x)
    variables = MaskedSelfAttention(3, 4, mask_mode="learnable").init(jax.random.key(0), x)
    with pytest.raises(ValueError, match=r"shape \(3, 5, 5\).*\[3, 7, 7\]"):
        MaskedSelfAttention(3, 4, mask_mode="learnable").apply(variables, jnp.zeros((2, 7, 8)))


@pytest.mark.parametrize(
    "mode, qk_norm, causal", [("none", False, False), ("learnable", True, False), ("fixed", False, True)]
)
def test_linen_and_nnx_agree(mode, qk_norm, causal):
    heads, head_dim, length, features = 2, 4, 6, 8
    pattern = np.where(np.eye(length, dtype=bool), 5.0, -5.0)
    x = jax.random.normal(jax.random.key(0), (3, length, features))
    options = {"mask_mode": mode, "mask_init": pattern, "qk_norm": qk_norm, "causal": causal}
    linen = MaskedSelfAttention(heads, head_dim, **options)
    variables = linen.init(jax.random.key(1), x)
    twin = NNXMaskedSelfAttention(features, heads, head_dim, length, **options, rngs=nnx.Rngs(2))
    params = variables["params"]
    chex.assert_trees_all_equal_shapes(nnx.to_pure_dict(nnx.state(twin, nnx.Param)), params)
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
    _, sown = linen.apply(variables, x, mutable=["intermediates"])
    _, twin_sown = nnx.capture(twin, nnx.Intermediate)(x, sow_weights=True)
    chex.assert_trees_all_close(twin_sown["attention"][0], sown["intermediates"]["attention"][0], atol=1e-6)


def test_nnx_module_in_bfloat16_returns_the_input_dtype_and_initialises_like_torch():
    twin = NNXMaskedSelfAttention(8, 2, 4, 6, dtype=jnp.bfloat16, rngs=nnx.Rngs(0))
    x = jax.random.normal(jax.random.key(0), (2, 6, 8), jnp.bfloat16)
    assert twin(x).dtype == jnp.bfloat16
    kernel = np.asarray(twin.qkv.kernel[...])
    assert kernel.dtype == np.float32 and kernel.shape == (8, 3, 2, 4)
    assert np.abs(kernel).max() <= 1 / np.sqrt(8) and kernel.std() > 0.5 / np.sqrt(3 * 8)


def test_nnx_train_step_moves_a_learnable_mask_and_never_a_fixed_one():
    pattern = np.where(np.eye(6, dtype=bool), 2.0, -2.0)
    x = jax.random.normal(jax.random.key(0), (2, 6, 8))
    for mode in ("fixed", "learnable"):
        model = NNXMaskedSelfAttention(8, 2, 4, 6, mask_mode=mode, mask_init=pattern, rngs=nnx.Rngs(0))
        optimizer = nnx.Optimizer(model, optax.adam(0.1), wrt=nnx.Param)

        @nnx.jit
        def step(model, optimizer):
            optimizer.update(model, nnx.grad(lambda m: jnp.sum(m(x) ** 2))(model))

        for _ in range(2):
            step(model, optimizer)
        moved = not np.array_equal(np.asarray(model.mask_logits[...][0]), pattern)
        assert moved == (mode == "learnable")


@pytest.mark.parametrize("causal", [False, True])
def test_fused_path_gives_the_einsum_numbers_and_sowing_keeps_the_weights(causal):
    x = jax.random.normal(jax.random.key(0), (3, 6, 8))
    pattern = np.where(np.eye(6, dtype=bool), 3.0, -3.0)
    options = {"mask_mode": "learnable", "mask_init": pattern, "causal": causal}
    einsum = MaskedSelfAttention(2, 4, attention_impl="einsum", **options)
    fused = MaskedSelfAttention(2, 4, attention_impl="fused", **options)
    variables = einsum.init(jax.random.key(1), x)
    chex.assert_trees_all_close(fused.apply(variables, x), einsum.apply(variables, x), rtol=1e-5, atol=1e-6)
    params = variables["params"]
    grads = [jax.grad(lambda p, m=m: jnp.sum(m.apply({"params": p}, x) ** 2))(params) for m in (einsum, fused)]
    chex.assert_trees_all_close(grads[0], grads[1], rtol=1e-4, atol=1e-6)
    _, sown = fused.apply(variables, x, mutable=["intermediates"])
    chex.assert_shape(sown["intermediates"]["attention"][0], (3, 2, 6, 6))
    with pytest.raises(ValueError, match="attention_impl"):
        MaskedSelfAttention(2, 4, attention_impl="flash").init(jax.random.key(1), x)


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


def test_split_qkv_gives_the_indexed_parts_and_their_gradient_bit_for_bit():
    from maskjax.attention import split_qkv

    qkv = jax.random.normal(jax.random.key(0), (2, 5, 3, 4, 8))
    weights = jax.random.normal(jax.random.key(1), (3, 2, 5, 4, 8))

    def loss(parts):
        return lambda x: sum(jnp.sum(w * p) for w, p in zip(weights, parts(x), strict=True))

    indexed = lambda x: (x[..., 0, :, :], x[..., 1, :, :], x[..., 2, :, :])  # noqa: E731
    chex.assert_trees_all_equal(split_qkv(qkv), indexed(qkv))
    chex.assert_trees_all_equal(jax.grad(loss(split_qkv))(qkv), jax.grad(loss(indexed))(qkv))


def test_a_toeplitz_mask_without_a_causal_mask_is_refused():
    """It holds offsets i - j >= 0 only: future keys would silently take the diagonal's logit."""
    x = jnp.ones((1, 5, 8))
    with pytest.raises(ValueError, match="needs causal=True"):
        MaskedSelfAttention(2, 4, mask_mode="learnable", mask_structure="toeplitz").init(jax.random.key(0), x)
    with pytest.raises(ValueError, match="needs causal=True"):
        NNXMaskedSelfAttention(8, 2, 4, 5, mask_mode="learnable", mask_structure="toeplitz", rngs=nnx.Rngs(0))
    variables = MaskedSelfAttention(2, 4, mask_mode="learnable", mask_structure="toeplitz", causal=True).init(
        jax.random.key(0), x
    )
    assert variables["params"]["mask_logits"].shape == (2, 5)


def test_the_fused_path_computes_the_mask_bias_in_float32(monkeypatch):
    """In bfloat16, s * M rounded before log_sigmoid moves an open entry's bias by ~3% (s = 10, M = 1.003)."""
    from maskjax import attention

    seen = {}
    real = jax.nn.dot_product_attention

    def capture(q, k, v, bias=None, **kwargs):
        seen["bias"] = bias
        return real(q, k, v, bias=bias, **kwargs)

    monkeypatch.setattr(jax.nn, "dot_product_attention", capture)
    q = jnp.ones((1, 4, 2, 8), jnp.bfloat16)
    mask = np.full((2, 4, 4), 1.003, np.float32)
    attention.fused_attention(q, q, q, jnp.asarray(mask), mask_scale=10.0)
    expected = np.log(1 / (1 + np.exp(-10.0 * mask.astype(np.float64))))
    np.testing.assert_array_equal(
        np.asarray(seen["bias"][0], np.float32),
        np.asarray(jnp.asarray(expected, jnp.float32).astype(jnp.bfloat16), np.float32),
    )


def test_causal_attention_with_more_queries_than_keys_is_refused_on_every_path():
    from maskjax.attention import fused_attention

    q, kv = jnp.ones((1, 3, 2, 4)), jnp.ones((1, 2, 2, 4))
    for attention in (maskjax.masked_attention, fused_attention):
        with pytest.raises(maskjax.ConfigError, match="3 queries against 2 keys"):
            attention(q, kv, kv, causal=True)


@settings(deadline=None, max_examples=10)
@given(
    batch=st.integers(1, 3),
    q_len=st.integers(1, 6),
    extra_keys=st.integers(0, 3),
    heads=st.integers(1, 3),
    head_dim=st.sampled_from([1, 4]),
    causal=st.booleans(),
    with_mask=st.booleans(),
    with_bias=st.booleans(),
)
def test_the_written_backward_equals_autodiff_in_float64(
    batch, q_len, extra_keys, heads, head_dim, causal, with_mask, with_bias
):
    """Issue 48: `manual_attention`'s hand-written vjp against autodiff of `masked_attention` (float64), for
    every shape, fewer queries than keys, causal or not, with a mask and a fixed bias or without."""
    from maskjax.attention import manual_attention, masked_attention

    kv_len = q_len + extra_keys
    rng = np.random.default_rng([batch, q_len, kv_len, heads, head_dim])
    with jax.enable_x64(True):
        q = jnp.asarray(rng.normal(size=(batch, q_len, heads, head_dim)))
        k, v = (jnp.asarray(rng.normal(size=(batch, kv_len, heads, head_dim))) for _ in range(2))
        m = jnp.asarray(rng.normal(scale=3.0, size=(heads, q_len, kv_len))) if with_mask else None
        bias = jnp.asarray(rng.normal(size=(heads, q_len, kv_len))) if with_bias else None
        g = jnp.asarray(rng.normal(size=(batch, q_len, heads, head_dim)))

        def reference(q, k, v, m, bias):
            if bias is None:
                return masked_attention(q, k, v, m, mask_scale=2.0, causal=causal)
            total = bias if m is None else bias + jax.nn.log_sigmoid(2.0 * m)
            return _biased(q, k, v, total, causal)

        def manual(q, k, v, m, bias):
            return manual_attention(q, k, v, m, mask_scale=2.0, causal=causal, bias=bias)

        outs, pulls = zip(*(jax.vjp(f, q, k, v, m, bias) for f in (reference, manual)), strict=True)
        np.testing.assert_allclose(outs[1], outs[0], rtol=1e-12, atol=1e-12)
        for expected, got in zip(pulls[0](g), pulls[1](g), strict=True):
            chex.assert_trees_all_close(got, expected, rtol=1e-10, atol=1e-12)


def _biased(q, k, v, total_HQK, causal):
    """softmax(q.k / sqrt(d) + total) v through the einsum path's own functions (autodiff's reference)."""
    from maskjax.attention import attend, biased_softmax, qk_logits

    return attend(biased_softmax(qk_logits(q, k) + total_HQK, None, causal=causal), v).astype(q.dtype)


@pytest.mark.parametrize("structure", ["full", "toeplitz"])
def test_the_manual_path_gives_the_einsum_numbers_and_mask_gradients_in_a_module(structure):
    x = jax.random.normal(jax.random.key(0), (3, 6, 8))
    options = {"mask_mode": "learnable", "causal": True, "mask_structure": structure}
    einsum = MaskedSelfAttention(2, 4, attention_impl="einsum", **options)
    manual = MaskedSelfAttention(2, 4, attention_impl="manual", **options)
    variables = einsum.init(jax.random.key(1), x)
    chex.assert_trees_all_close(manual.apply(variables, x), einsum.apply(variables, x), rtol=1e-5, atol=1e-6)
    params = variables["params"]
    grads = [jax.grad(lambda p, m=m: jnp.sum(m.apply({"params": p}, x) ** 2))(params) for m in (einsum, manual)]
    chex.assert_trees_all_close(grads[0], grads[1], rtol=1e-4, atol=1e-6)
    assert np.abs(np.asarray(grads[1]["mask_logits"])).max() > 0


def test_auto_takes_the_manual_path_on_cpu_unless_the_bias_is_per_example():
    """Issue 48: the written backward measured faster on CPU is the default there; a per-example bias, which it
    does not take, falls back to einsum under auto and is refused by an explicit manual."""
    from maskjax.attention import attention_path, manual_attention

    assert attention_path("auto", sowing=False) is manual_attention
    assert attention_path("auto", sowing=False, bias=jnp.zeros((3, 2, 5, 5))) is None
    assert attention_path("auto", sowing=False, bias=jnp.zeros((2, 5, 5))) is manual_attention
    assert attention_path("auto", sowing=True) is None and attention_path("einsum", sowing=False) is None
    x = jax.random.normal(jax.random.key(0), (3, 5, 8))
    per_example = jax.random.normal(jax.random.key(2), (3, 2, 5, 5))
    auto, einsum = (MaskedSelfAttention(2, 4, attention_impl=impl) for impl in ("auto", "einsum"))
    variables = einsum.init(jax.random.key(1), x)
    chex.assert_trees_all_close(auto.apply(variables, x, per_example), einsum.apply(variables, x, per_example))
    with pytest.raises(maskjax.ConfigError, match="bias shared by the batch"):
        MaskedSelfAttention(2, 4, attention_impl="manual").apply(variables, x, per_example)
