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
from maskjax.bias import MaskBias, with_mask_bias
from maskjax.nnx_modules import NNXMaskBias

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
    # a uniform mask (M = 0: every logit of a row shifted alike) leaves the pretrained model's function
    # unchanged and can learn; an "open" mask of 30 also reproduces it, but its gradient is ~1e-13
    host = lambda mask: {**params, "MaskBias_0": {"mask_logits": jnp.full((2, 4, 4), mask)}}  # noqa: E731
    gradient = jax.grad(lambda p: jnp.sum(jnp.sin(_Host(True).apply({"params": p}, x))))
    for mask, smallest, largest in ((0.0, 1e-4, np.inf), (30.0, 0.0, 1e-11)):
        np.testing.assert_allclose(
            _Host(True).apply({"params": host(mask)}, x), _Host(False).apply({"params": pretrained}, x), atol=1e-6
        )
        assert smallest < np.abs(gradient(host(mask))["MaskBias_0"]["mask_logits"]).max() < largest
    decays = maskjax.decay_mask(params)
    assert decays["MaskBias_0"]["mask_logits"] is False and decays["Dense_0"]["kernel"] is True
    optimizer = optax.adamw(1e-2, weight_decay=0.5, mask=maskjax.decay_mask)
    updates, _ = optimizer.update(jax.tree.map(jnp.zeros_like, params), optimizer.init(params), params)
    assert not np.any(updates["MaskBias_0"]["mask_logits"]) and np.any(updates["Dense_0"]["kernel"])
    with pytest.raises(ValueError, match=r"missing \['Dense_0'\]\['bias'\]"):
        maskjax.with_mask_params({**pretrained, "Dense_0": {"kernel": pretrained["Dense_0"]["kernel"]}}, initialised)
    with pytest.raises(ValueError, match=r"not in the model \['Extra'\]"):
        maskjax.with_mask_params({**pretrained, "Extra": jnp.zeros(2)}, initialised)


def test_with_mask_params_refuses_a_parameter_of_another_shape_or_dtype_by_name():
    x = jax.random.normal(jax.random.key(0), (2, 4, 8))
    pretrained = _Host(False).init(jax.random.key(1), x)["params"]
    initialised = _Host(True).init(jax.random.key(2), x)["params"]
    wider = {**pretrained, "Dense_0": {**pretrained["Dense_0"], "kernel": jnp.zeros((8, 9))}}
    with pytest.raises(maskjax.ConfigError, match=r"\['Dense_0'\]\['kernel'\] is \[8, 9\] float32 in the checkpoint"):
        maskjax.with_mask_params(wider, initialised)
    halved = jax.tree.map(lambda leaf: leaf.astype(jnp.bfloat16), pretrained)
    with pytest.raises(maskjax.ConfigError, match="bfloat16 in the checkpoint, .* float32 in the model"):
        maskjax.with_mask_params(halved, initialised)


def test_decay_mask_and_fixed_masks_find_the_mask_in_an_nnx_state_in_the_functional_loop():
    """nnx.split gives an nnx.State whose paths run through each Variable to `.value`; the mask is still
    found there, so optax's decay leaves it and `freeze_fixed_masks` holds a fixed one in params."""
    rngs = nnx.Rngs(0)
    bias = NNXMaskBias(HEADS, LENGTH, mask_init=PATTERN, rngs=rngs)
    attention = nnx.MultiHeadAttention(HEADS, FEATURES, decode=False, attention_fn=bias, rngs=rngs)
    graph, params, rest = nnx.split(attention, nnx.Param, ...)
    optimizer = optax.adamw(0.1, weight_decay=0.5, mask=maskjax.decay_mask)
    zero = jax.tree.map(jnp.zeros_like, params)
    updates, _ = optimizer.update(zero, optimizer.init(params), params)
    assert not np.any(updates["attention_fn"]["mask_logits"][...]), "weight decay moved the mask"
    assert np.any(updates["query"]["kernel"][...])
    stepped = nnx.merge(graph, optax.apply_updates(params, updates), rest)
    np.testing.assert_array_equal(
        stepped.attention_fn.mask_logits[...], np.broadcast_to(PATTERN, (HEADS, LENGTH, LENGTH))
    )
    # the same through nnx.Optimizer, which hands optax the model's Param state
    trainer = nnx.Optimizer(attention, optax.adamw(0.1, weight_decay=0.5, mask=maskjax.decay_mask), wrt=nnx.Param)
    trainer.update(attention, jax.tree.map(jnp.zeros_like, nnx.state(attention, nnx.Param)))
    np.testing.assert_array_equal(
        attention.attention_fn.mask_logits[...], np.broadcast_to(PATTERN, (HEADS, LENGTH, LENGTH))
    )
    state = nnx.State({"block": {maskjax.bias.FIXED_MASK_PARAM: nnx.Param(jnp.ones(3)), "w": nnx.Param(jnp.ones(3))}})
    frozen = jax.tree_util.tree_leaves(maskjax.fixed_masks(state))
    assert sorted(frozen) == [False, True]


def test_a_layout_that_does_not_fit_names_the_one_that_would():
    logits_BTNS = jnp.zeros((2, LENGTH, 3, LENGTH))  # 3 heads, read as queries under "BHQK"
    mask = np.zeros((3, LENGTH, LENGTH), np.float32)
    with pytest.raises(maskjax.ConfigError, match="read as 'BHQK'; layout 'BQHK' or 'BTNS' would fit"):
        maskjax.add_attention_bias(logits_BTNS, mask, layout="BHQK")
    with pytest.raises(maskjax.ConfigError, match="read as 'BTNS'\\)$"):  # nothing fits: no hint
        maskjax.add_attention_bias(jnp.zeros((2, 5, 3, 7)), mask, layout="BTNS")


def test_a_trained_relative_mask_extends_to_a_longer_length_from_its_farthest_logit():
    trained = jnp.asarray([[3.0, 1.0, -2.0], [0.5, 0.0, -1.0]])
    longer = maskjax.extend_relative_mask(trained, 5)
    np.testing.assert_array_equal(longer, [[3, 1, -2, -2, -2], [0.5, 0, -1, -1, -1]])
    # over the old length the longer mask gives the same bias; a longer sequence now fits
    np.testing.assert_array_equal(
        maskjax.attention_bias(longer, 3, 3, mask_structure="toeplitz"),
        maskjax.attention_bias(trained, 3, 3, mask_structure="toeplitz"),
    )
    assert maskjax.attention_bias(longer, 5, 5, mask_structure="toeplitz").shape == (1, 2, 5, 5)
    both_ways = maskjax.extend_relative_mask(jnp.asarray([[1.0, 2.0, 3.0]]), 3, causal=False)
    np.testing.assert_array_equal(both_ways, [[1, 1, 2, 3, 3]])  # offsets -1..1 of length 2 to -2..2
    with pytest.raises(maskjax.ConfigError, match="shorter length 2"):
        maskjax.extend_relative_mask(trained, 2)
