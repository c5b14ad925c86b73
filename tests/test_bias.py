import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import linen as nn
from flax import nnx

import maskjax
from maskjax import mask_patterns
from maskjax.bias import MaskBias, NNXMaskBias, with_mask_bias

HEADS, LENGTH, FEATURES = 2, 6, 8
PATTERN = np.asarray(mask_patterns.mask_logits(np.tril(np.ones((LENGTH, LENGTH), bool)), 4.0, -4.0))


class LinenBlock(nn.Module):
    """Flax's own attention with the mask added: the two lines docs/embedding.md shows."""

    mask_mode: str = "learnable"
    decode: bool = False

    @nn.compact
    def __call__(self, x, mask=None, query_positions=None):
        attention_fn = MaskBias(HEADS, LENGTH, mask_mode=self.mask_mode, mask_init=PATTERN)(query_positions)
        attention = nn.MultiHeadDotProductAttention(num_heads=HEADS, attention_fn=attention_fn, decode=self.decode)
        return attention(x, mask=mask)


def projections(params, x):
    names = ("query", "key", "value")
    return tuple(jnp.einsum("bld,dhe->blhe", x, params[n]["kernel"]) + params[n]["bias"] for n in names)


def reference(params, x, mask_logits):
    out = maskjax.masked_attention(*projections(params, x), mask_logits)
    return jnp.einsum("blhe,hed->bld", out, params["out"]["kernel"]) + params["out"]["bias"]


def test_linen_attention_with_mask_bias_equals_masked_attention_and_grads_reach_the_mask():
    x = jax.random.normal(jax.random.key(0), (3, LENGTH, FEATURES))
    block = LinenBlock()
    variables = block.init(jax.random.key(1), x)
    params = variables["params"]
    chex.assert_trees_all_close(params["MaskBias_0"]["mask_logits"], np.broadcast_to(PATTERN, (HEADS, LENGTH, LENGTH)))
    expected = reference(params["MultiHeadDotProductAttention_0"], x, params["MaskBias_0"]["mask_logits"])
    chex.assert_trees_all_close(block.apply(variables, x), expected, rtol=1e-5, atol=1e-5)
    grads = jax.grad(lambda p: jnp.sum(block.apply({"params": p}, x) ** 2))(params)
    mask_grad = np.asarray(grads["MaskBias_0"]["mask_logits"])
    assert np.all(np.isfinite(mask_grad)) and np.abs(mask_grad).max() > 0


def test_a_fixed_mask_lives_in_constants_and_an_optimizer_step_leaves_it():
    x = jax.random.normal(jax.random.key(0), (2, LENGTH, FEATURES))
    block = LinenBlock(mask_mode="fixed")
    variables = block.init(jax.random.key(1), x)
    params, constants = variables["params"], variables["constants"]
    assert "MaskBias_0" not in params
    optimizer = optax.adam(0.1)
    state = optimizer.init(params)
    grads = jax.grad(lambda p: jnp.sum(block.apply({"params": p, "constants": constants}, x) ** 2))(params)
    updates, _ = optimizer.update(grads, state)
    moved = optax.apply_updates(params, updates)
    assert not np.allclose(
        moved["MultiHeadDotProductAttention_0"]["query"]["kernel"],
        params["MultiHeadDotProductAttention_0"]["query"]["kernel"],
    )
    np.testing.assert_array_equal(np.asarray(constants["MaskBias_0"]["mask_logits"][0]), PATTERN)


def test_decoding_token_by_token_with_the_cache_equals_the_causal_forward():
    x = jax.random.normal(jax.random.key(0), (2, LENGTH, FEATURES))
    variables = LinenBlock(decode=True).init(jax.random.key(1), x)
    full = LinenBlock().apply({"params": variables["params"]}, x, mask=nn.make_causal_mask(x[..., 0]))
    cache = variables["cache"]
    for t in range(LENGTH):
        step, state = LinenBlock(decode=True).apply(
            {"params": variables["params"], "cache": cache},
            x[:, t : t + 1],
            query_positions=jnp.array([t]),
            mutable=["cache"],
        )
        cache = state["cache"]
        chex.assert_trees_all_close(step[:, 0], full[:, t], rtol=1e-5, atol=1e-5)


def test_jax_dot_product_attention_takes_the_mask_as_its_bias():
    q, k, v = jax.random.normal(jax.random.key(0), (3, 2, LENGTH, HEADS, 4))
    fused = jax.nn.dot_product_attention(q, k, v, bias=maskjax.mask_bias(PATTERN)[None, None])
    chex.assert_trees_all_close(fused, maskjax.masked_attention(q, k, v, PATTERN), rtol=1e-5, atol=1e-6)


def test_a_mask_of_the_wrong_length_or_an_attention_fn_without_bias_is_refused_by_name():
    q = jnp.zeros((1, LENGTH + 1, HEADS, 4))
    attention_fn = with_mask_bias(jnp.asarray(PATTERN))
    with pytest.raises(ValueError, match=rf"shape \({LENGTH}, {LENGTH}\).*{LENGTH + 1} keys"):
        attention_fn(q, q, q)
    with pytest.raises(ValueError, match="query_positions"):
        attention_fn(q[:, :2], q[:, :LENGTH], q[:, :LENGTH])
    with pytest.raises(ValueError, match="no `bias`"):
        with_mask_bias(jnp.asarray(PATTERN), attention_fn=lambda query, key, value: query)


@pytest.mark.parametrize("mode", ["learnable", "fixed"])
def test_nnx_attention_with_mask_bias_equals_masked_attention_and_trains_only_params(mode):
    rngs = nnx.Rngs(0)
    bias = NNXMaskBias(HEADS, LENGTH, mask_mode=mode, mask_init=PATTERN, rngs=rngs)
    model = nnx.MultiHeadAttention(HEADS, FEATURES, attention_fn=bias, decode=False, rngs=rngs)
    x = jax.random.normal(jax.random.key(0), (2, LENGTH, FEATURES))
    params = {
        n: {"kernel": getattr(model, n).kernel[...], "bias": getattr(model, n).bias[...]}
        for n in ("query", "key", "value", "out")
    }
    chex.assert_trees_all_close(model(x), reference(params, x, PATTERN), rtol=1e-5, atol=1e-5)
    optimizer = nnx.Optimizer(model, optax.adam(0.1), wrt=nnx.Param)
    before = np.asarray(model.attention_fn.mask_logits[...])
    grads = nnx.grad(lambda m: jnp.sum(m(x) ** 2))(model)
    optimizer.update(model, grads)
    after = np.asarray(model.attention_fn.mask_logits[...])
    if mode == "fixed":
        np.testing.assert_array_equal(after, before)
    else:
        assert np.abs(after - before).max() > 0


def test_an_array_mask_consumes_no_key_so_the_hosts_other_parameters_keep_their_values():
    def host(with_mask: bool):
        rngs = nnx.Rngs(0)
        mask = NNXMaskBias(2, 4, mask_init=np.zeros((2, 4, 4)), rngs=rngs) if with_mask else None
        return mask, nnx.Linear(3, 5, rngs=rngs)

    np.testing.assert_array_equal(host(True)[1].kernel[...], host(False)[1].kernel[...])


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"mask_init": "diagonal"}, "a mask must be an array of numbers"),
        ({"mask_mode": "none"}, "needs mask_mode 'learnable' or 'fixed', got 'none'"),
        ({"mask_mode": "learned"}, "needs mask_mode 'learnable' or 'fixed', got 'learned'"),
    ],
)
def test_bad_drop_in_masks_are_refused_in_words(kwargs, message):
    with pytest.raises(ValueError, match=message):
        MaskBias(2, 4, **kwargs).init(jax.random.key(0))
    with pytest.raises(ValueError, match=message):
        NNXMaskBias(2, 4, **kwargs, rngs=nnx.Rngs(0))


class _Host(nn.Module):
    """A host block: Flax's attention and a Dense, with or without the drop-in mask."""

    masked: bool

    @nn.compact
    def __call__(self, x):
        kwargs = {"attention_fn": MaskBias(2, 4, mask_init=np.full((2, 4, 4), 3.0))()} if self.masked else {}
        return nn.Dense(8)(nn.MultiHeadDotProductAttention(num_heads=2, **kwargs)(x))


def test_pretrained_weights_load_into_the_masked_model_and_decay_skips_the_mask():
    x = jax.random.normal(jax.random.key(0), (2, 4, 8))
    pretrained = _Host(False).init(jax.random.key(1), x)["params"]
    initialised = _Host(True).init(jax.random.key(2), x)["params"]
    params = maskjax.with_mask_params(pretrained, initialised)
    chex.assert_trees_all_equal(params["MaskBias_0"], initialised["MaskBias_0"])
    chex.assert_trees_all_equal({k: v for k, v in params.items() if k != "MaskBias_0"}, pretrained)
    # an open mask (log_sigmoid(M) ~ 0 everywhere) leaves the pretrained model's function unchanged
    opened = {**params, "MaskBias_0": {"mask_logits": jnp.full((2, 4, 4), 30.0)}}
    np.testing.assert_allclose(
        _Host(True).apply({"params": opened}, x), _Host(False).apply({"params": pretrained}, x), atol=1e-6
    )
    decays = maskjax.decay_mask(params)
    assert decays["MaskBias_0"]["mask_logits"] is False and decays["Dense_0"]["kernel"] is True
    optimizer = optax.adamw(1e-2, weight_decay=0.5, mask=maskjax.decay_mask)
    updates, _ = optimizer.update(jax.tree.map(jnp.zeros_like, params), optimizer.init(params), params)
    assert not np.any(updates["MaskBias_0"]["mask_logits"]) and np.any(updates["Dense_0"]["kernel"])
    with pytest.raises(ValueError, match=r"missing \['Dense_0'\]\['bias'\]"):
        maskjax.with_mask_params({**pretrained, "Dense_0": {"kernel": pretrained["Dense_0"]["kernel"]}}, initialised)
    with pytest.raises(ValueError, match=r"not in the model \['Extra'\]"):
        maskjax.with_mask_params({**pretrained, "Extra": jnp.zeros(2)}, initialised)
