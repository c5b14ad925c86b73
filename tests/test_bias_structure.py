"""Issue 31 items 1, 2, 4, 5: the drop-in mask at any length (relative), in named layouts, decoding under jit,
and a fixed mask in a params-only train state. Numbers are checked against numpy float64 references."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import linen as nn
from flax import nnx

import maskjax
from maskjax.bias import (
    MaskBias,
    add_attention_bias,
    attention_bias,
    bias_layout,
    fixed_masks,
    freeze_fixed_masks,
    with_mask_bias,
)
from maskjax.nnx_modules import NNXMaskBias

HEADS, LENGTH, FEATURES, HEAD_DIM = 2, 6, 8, 4
RELATIVE = np.random.default_rng(0).normal(size=(HEADS, LENGTH)) * 3.0  # causal: distances 0..5
BIDIRECTIONAL = np.random.default_rng(1).normal(size=(HEADS, 2 * LENGTH - 1)) * 3.0  # offsets -5..5


def log_sigmoid64(x):
    return -np.logaddexp(0.0, -np.asarray(x, np.float64))


def reference_bias(relative, query_positions, kv_len, causal, scale=1.0):
    """The relative mask's bias [heads, q, k] in float64, entry by entry; -inf where a causal mask hides."""
    heads, size = relative.shape
    length = size if causal else (size + 1) // 2
    out = np.empty((heads, len(query_positions), kv_len))
    for i, position in enumerate(query_positions):
        for j in range(kv_len):
            offset = position - j
            if causal:
                out[:, i, j] = log_sigmoid64(scale * relative[:, offset]) if offset >= 0 else -np.inf
            else:
                out[:, i, j] = log_sigmoid64(scale * relative[:, offset + length - 1])
    return out


def reference_attention(q, k, v, bias_HQK):
    """softmax(q.k / sqrt(d) + bias) v in float64; q, k, v [batch, length, heads, head_dim]."""
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    logits = np.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(q.shape[-1]) + bias_HQK[None]
    weights = np.exp(logits - logits.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    return np.einsum("bhqk,bkhd->bqhd", weights, v)


def qkv(q_len, kv_len, seed=0):
    keys = jax.random.split(jax.random.key(seed), 3)
    q = jax.random.normal(keys[0], (2, q_len, HEADS, HEAD_DIM))
    k, v = (jax.random.normal(key, (2, kv_len, HEADS, HEAD_DIM)) for key in keys[1:])
    return q, k, v


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize(
    ("q_len", "kv_len", "positions"),
    [(6, 6, None), (4, 4, None), (2, 2, None), (1, 6, [3]), (2, 5, [1, 4])],
)
def test_a_relative_mask_matches_the_float64_reference_at_every_length_and_decode_step(
    causal, q_len, kv_len, positions
):
    relative = RELATIVE if causal else BIDIRECTIONAL
    q, k, v = qkv(q_len, kv_len)
    attention_fn = with_mask_bias(
        jnp.asarray(relative, jnp.float32),
        mask_structure="toeplitz",
        causal=causal,
        mask_scale=0.5,
        query_positions=None if positions is None else jnp.array(positions),
    )
    out = attention_fn(q, k, v)
    chex.assert_shape(out, (2, q_len, HEADS, HEAD_DIM))
    rows = list(range(kv_len - q_len, kv_len)) if positions is None else positions
    expected = reference_attention(q, k, v, reference_bias(relative, rows, kv_len, causal, scale=0.5))
    np.testing.assert_allclose(np.asarray(out), expected, rtol=2e-5, atol=2e-5)


def test_a_non_causal_relative_mask_gives_each_future_offset_its_own_logit():
    bias = np.asarray(
        attention_bias(jnp.asarray(BIDIRECTIONAL), LENGTH, LENGTH, mask_structure="toeplitz", causal=False)
    )
    chex.assert_shape(bias, (1, HEADS, LENGTH, LENGTH))
    for i in range(LENGTH):
        for j in range(LENGTH):
            np.testing.assert_allclose(bias[0, :, i, j], log_sigmoid64(BIDIRECTIONAL[:, i - j + LENGTH - 1]), rtol=1e-6)
    # a future key does not get the diagonal's value (the old bug)
    assert not np.allclose(bias[0, :, 0, 1], bias[0, :, 0, 0])


def test_a_causal_relative_mask_hides_future_keys_even_when_the_host_passes_no_mask():
    q, k, v = qkv(LENGTH, LENGTH)
    attention_fn = with_mask_bias(jnp.asarray(RELATIVE, jnp.float32), mask_structure="toeplitz")
    weights_out = attention_fn(q, k, v)
    causal = nn.make_causal_mask(jnp.ones((2, LENGTH)))
    chex.assert_trees_all_close(weights_out, attention_fn(q, k, v, mask=causal), rtol=1e-6, atol=1e-6)
    bias = np.asarray(attention_bias(jnp.asarray(RELATIVE), LENGTH, LENGTH, mask_structure="toeplitz"))
    assert np.all(bias[0][:, np.triu_indices(LENGTH, 1)[0], np.triu_indices(LENGTH, 1)[1]] < -1e30)


class RelativeGPT(nn.Module):
    """Flax's attention with a relative mask, as docs/embedding.md's GPT block."""

    decode: bool = False
    mask_mode: str = "learnable"

    @nn.compact
    def __call__(self, x):
        attention_fn = MaskBias(
            HEADS, LENGTH, mask_mode=self.mask_mode, mask_init=RELATIVE, mask_structure="toeplitz", decode=self.decode
        )()
        mask = None if self.decode else nn.make_causal_mask(x[..., 0])
        return nn.MultiHeadDotProductAttention(num_heads=HEADS, attention_fn=attention_fn, decode=self.decode)(
            x, mask=mask
        )


def linen_reference(params, x, relative):
    """The block's output from its parameters, in float64 numpy."""
    p = jax.tree.map(lambda a: np.asarray(a, np.float64), params["MultiHeadDotProductAttention_0"])
    x = np.asarray(x, np.float64)
    q, k, v = (np.einsum("bld,dhe->blhe", x, p[n]["kernel"]) + p[n]["bias"] for n in ("query", "key", "value"))
    length = x.shape[1]
    out = reference_attention(q, k, v, reference_bias(np.asarray(relative, np.float64), range(length), length, True))
    return np.einsum("blhe,hed->bld", out, p["out"]["kernel"]) + p["out"]["bias"]


def test_linen_relative_mask_trains_at_one_length_evaluates_at_another_and_grads_reach_it():
    x = jax.random.normal(jax.random.key(0), (3, LENGTH, FEATURES))
    block = RelativeGPT()
    variables = block.init(jax.random.key(1), x)
    chex.assert_shape(variables["params"]["MaskBias_0"]["mask_logits"], (HEADS, LENGTH))
    for length in (LENGTH, 4, 1):
        out = block.apply(variables, x[:, :length])
        chex.assert_shape(out, (3, length, FEATURES))
        np.testing.assert_allclose(
            np.asarray(out), linen_reference(variables["params"], x[:, :length], RELATIVE), rtol=2e-5, atol=2e-5
        )
    chex.assert_trees_all_equal(block.apply(variables, x), block.apply(variables, x))  # deterministic
    for length in (LENGTH, 3):
        grads = jax.grad(lambda p, n=length: jnp.sum(block.apply({"params": p}, x[:, :n]) ** 2))(variables["params"])
        mask_grad = np.asarray(grads["MaskBias_0"]["mask_logits"])
        chex.assert_shape(mask_grad, (HEADS, LENGTH))
        assert np.all(np.isfinite(mask_grad)) and np.abs(mask_grad[:, :length]).min() > 0
        np.testing.assert_array_equal(mask_grad[:, length:], 0.0)  # distances the shorter input never has


def test_linen_decoding_under_jit_with_the_cache_index_equals_the_full_forward():
    x = jax.random.normal(jax.random.key(0), (2, LENGTH, FEATURES))
    variables = RelativeGPT(decode=True).init(jax.random.key(1), x)
    full = RelativeGPT().apply({"params": variables["params"]}, x)

    @jax.jit
    def step(params, cache, token):
        return RelativeGPT(decode=True).apply({"params": params, "cache": cache}, token, mutable=["cache"])

    cache = variables["cache"]
    for t in range(LENGTH):
        out, state = step(variables["params"], cache, x[:, t : t + 1])
        cache = state["cache"]
        chex.assert_trees_all_close(out[:, 0], full[:, t], rtol=1e-5, atol=1e-5)
        assert int(cache["MaskBias_0"]["cache_index"]) == t + 1


def test_nnx_relative_mask_decodes_under_nnx_jit_and_serves_a_shorter_sequence():
    rngs = nnx.Rngs(0)
    bias = NNXMaskBias(HEADS, LENGTH, mask_init=RELATIVE, mask_structure="toeplitz", rngs=rngs)
    model = nnx.MultiHeadAttention(HEADS, FEATURES, attention_fn=bias, decode=False, rngs=rngs)
    x = jax.random.normal(jax.random.key(0), (2, LENGTH, FEATURES))
    causal = nn.make_causal_mask(x[..., 0])
    full = model(x, mask=causal)
    chex.assert_trees_all_close(model(x[:, :4], mask=causal[..., :4, :4]), full[:, :4], rtol=1e-5, atol=1e-5)
    chex.assert_shape(model.attention_fn.mask_logits[...], (HEADS, LENGTH))

    decoder = nnx.view(model, decode=True)  # switches NNXMaskBias too, and makes its cache index
    assert decoder.attention_fn.decode and int(decoder.attention_fn.cache_index[...]) == 0
    decoder.init_cache((2, LENGTH, FEATURES))  # the host's own cache: its init_cache is not recursive

    @nnx.jit
    def step(decoder, token):
        return decoder(token)

    for t in range(LENGTH):
        chex.assert_trees_all_close(step(decoder, x[:, t : t + 1])[:, 0], full[:, t], rtol=1e-5, atol=1e-5)
    assert int(decoder.attention_fn.cache_index[...]) == LENGTH
    decoder.attention_fn.init_cache()
    assert int(decoder.attention_fn.cache_index[...]) == 0


def test_the_full_mask_keeps_its_length_and_says_so_and_a_relative_one_refuses_longer_inputs():
    q, k, v = qkv(LENGTH - 2, LENGTH - 2)
    full = with_mask_bias(jnp.zeros((HEADS, LENGTH, LENGTH)))
    with pytest.raises(ValueError, match=r"fixed length 6.*mask_structure='toeplitz'"):
        full(q, k, v)
    relative = with_mask_bias(jnp.zeros((HEADS, 3)), mask_structure="toeplitz")
    with pytest.raises(ValueError, match="length 3.*cannot cover 4 keys"):
        relative(q, k, v)
    with pytest.raises(ValueError, match=r"2 \* length - 1 offsets"):
        with_mask_bias(jnp.zeros((HEADS, 4)), mask_structure="toeplitz", causal=False)(q, k, v)
    with pytest.raises(ValueError, match=r"\[heads, offsets\]"):
        with_mask_bias(jnp.zeros((HEADS, LENGTH, LENGTH)), mask_structure="toeplitz")
    with pytest.raises(ValueError, match="has 3 heads; the attention has 2"):
        with_mask_bias(jnp.zeros((3, 4, 4)))(q, k, v)
    with pytest.raises(ValueError, match="unknown mask_structure 'relative'"):
        MaskBias(HEADS, LENGTH, mask_structure="relative").init(jax.random.key(0))
    with pytest.raises(ValueError, match="call init_cache"):
        mask = NNXMaskBias(HEADS, LENGTH, mask_structure="toeplitz", rngs=nnx.Rngs(0))
        mask.decode = True
        mask(q, k, v)


@pytest.mark.parametrize("heads", [2, 5])  # 5: heads == length, where both orders broadcast
def test_a_btns_host_gets_the_bias_on_the_right_axes(heads):
    length = 5
    mask = np.random.default_rng(2).normal(size=(heads, length, length)) * 3.0
    q, k = jax.random.normal(jax.random.key(3), (2, 2, length, heads, HEAD_DIM))
    logits_BTNS = jnp.einsum("btnh,bsnh->btns", q, k) / np.sqrt(HEAD_DIM)  # as Gemma computes them
    biased = add_attention_bias(logits_BTNS, jnp.asarray(mask), layout="BTNS")
    chex.assert_shape(biased, (2, length, heads, length))
    expected = np.einsum("btnh,bsnh->btns", np.asarray(q, np.float64), np.asarray(k, np.float64)) / np.sqrt(HEAD_DIM)
    expected = expected + np.transpose(log_sigmoid64(mask), (1, 0, 2))[None]
    np.testing.assert_allclose(np.asarray(biased), expected, rtol=1e-5, atol=1e-5)
    bhqk = add_attention_bias(jnp.swapaxes(logits_BTNS, 1, 2), jnp.asarray(mask), layout="BHQK")
    chex.assert_trees_all_close(jnp.swapaxes(bhqk, 1, 2), biased)
    chex.assert_trees_all_close(
        bias_layout(maskjax.mask_bias(mask), "BTNS")[0], jnp.swapaxes(maskjax.mask_bias(mask), 0, 1)
    )
    if heads != length:  # the other layout's shapes do not fit: refused by name, not broadcast
        with pytest.raises(ValueError, match=f"has {heads} heads; the attention has {length}"):
            add_attention_bias(logits_BTNS, jnp.asarray(mask), layout="BHQK")


def test_bad_layouts_and_shapes_are_refused_in_words():
    logits = jnp.zeros((1, 4, 2, 4))
    with pytest.raises(ValueError, match="unknown layout 'BSNT'"):
        add_attention_bias(logits, jnp.zeros((2, 4, 4)), layout="BSNT")
    with pytest.raises(TypeError):
        add_attention_bias(logits, jnp.zeros((2, 4, 4)))  # the layout is never guessed
    with pytest.raises(ValueError, match="not 4-D"):
        add_attention_bias(logits[0], jnp.zeros((2, 4, 4)), layout="BTNS")
    with pytest.raises(ValueError, match=r"not \[heads, q_len, kv_len\]"):
        bias_layout(jnp.zeros((1, 2, 4, 4)), "BHQK")
    with pytest.raises(ValueError, match="unknown layout"):
        MaskBias(2, 4, layout="BHKQ").init(jax.random.key(0))


def test_a_relative_mask_in_a_btns_host_and_in_decoding_matches_the_reference():
    length = 6
    q, k = jax.random.normal(jax.random.key(4), (2, 2, length, HEADS, HEAD_DIM))
    logits_BTNS = jnp.einsum("btnh,bsnh->btns", q, k)
    step = add_attention_bias(
        logits_BTNS[:, 2:3], jnp.asarray(RELATIVE), layout="BTNS", mask_structure="toeplitz", query_positions=[2]
    )
    expected = (
        np.asarray(logits_BTNS[:, 2:3], np.float64)
        + np.swapaxes(reference_bias(RELATIVE, [2], length, True), 0, 1)[None]
    )
    visible = np.isfinite(expected)
    np.testing.assert_allclose(np.asarray(step)[visible], expected[visible], rtol=1e-5, atol=1e-5)
    assert np.all(np.asarray(step)[~visible] < -1e30)


class ParamsOnlyHost(nn.Module):
    """A host whose train state keeps `params` only (as lm1b or big_vision): the fixed mask lives there."""

    @nn.compact
    def __call__(self, x):
        attention_fn = MaskBias(
            HEADS, LENGTH, mask_mode="fixed", mask_init=RELATIVE, mask_structure="toeplitz", mask_collection="params"
        )()
        return nn.Dense(FEATURES)(nn.MultiHeadDotProductAttention(num_heads=HEADS, attention_fn=attention_fn)(x))


def test_a_fixed_mask_in_params_gets_no_gradient_and_no_optimizer_moves_it():
    x = jax.random.normal(jax.random.key(0), (2, LENGTH, FEATURES))
    variables = ParamsOnlyHost().init(jax.random.key(1), x)
    assert set(variables) == {"params"}
    params = variables["params"]
    np.testing.assert_array_equal(params["MaskBias_0"]["fixed_mask_logits"], RELATIVE.astype(np.float32))
    loss = lambda p: jnp.sum(ParamsOnlyHost().apply({"params": p}, x) ** 2)  # noqa: E731
    grads = jax.grad(loss)(params)
    np.testing.assert_array_equal(grads["MaskBias_0"]["fixed_mask_logits"], 0.0)
    assert np.abs(grads["Dense_0"]["kernel"]).max() > 0
    assert fixed_masks(params)["MaskBias_0"]["fixed_mask_logits"] is True
    assert maskjax.decay_mask(params)["MaskBias_0"]["fixed_mask_logits"] is False
    for optimizer in (
        optax.adamw(0.1, weight_decay=0.5, mask=maskjax.decay_mask),
        freeze_fixed_masks(optax.chain(optax.add_decayed_weights(0.5), optax.sgd(0.1, momentum=0.9))),
    ):
        state, moved = optimizer.init(params), params
        for _ in range(2):
            updates, state = optimizer.update(jax.grad(loss)(moved), state, moved)
            moved = optax.apply_updates(moved, updates)
        np.testing.assert_array_equal(
            moved["MaskBias_0"]["fixed_mask_logits"], params["MaskBias_0"]["fixed_mask_logits"]
        )
        assert not np.allclose(moved["Dense_0"]["kernel"], params["Dense_0"]["kernel"])
    # an unknown collection is refused by name
    with pytest.raises(ValueError, match="unknown mask_collection 'state'"):
        MaskBias(HEADS, LENGTH, mask_mode="fixed", mask_collection="state").init(jax.random.key(0))


class ScanLayer(nn.Module):
    mask_collection: str = "constants"

    @nn.compact
    def __call__(self, x, _):
        attention_fn = MaskBias(
            HEADS,
            LENGTH,
            mask_mode="fixed",
            mask_init=RELATIVE,
            mask_structure="toeplitz",
            mask_collection=self.mask_collection,
        )()
        return x + nn.MultiHeadDotProductAttention(num_heads=HEADS, attention_fn=attention_fn)(x), None


@pytest.mark.parametrize("mask_collection", ["constants", "params"])
def test_an_nn_scan_host_carries_the_fixed_mask_per_layer(mask_collection):
    """nn.scan needs every collection a layer holds in variable_axes: "constants" too for the default fixed mask."""
    axes = {"params": 0, "constants": 0} if mask_collection == "constants" else {"params": 0}
    stack = nn.scan(ScanLayer, variable_axes=axes, split_rngs={"params": True}, length=3)(
        mask_collection=mask_collection
    )
    x = jax.random.normal(jax.random.key(0), (2, LENGTH, FEATURES))
    variables = stack.init(jax.random.key(1), x, None)
    name = "mask_logits" if mask_collection == "constants" else "fixed_mask_logits"
    stored = variables[mask_collection]["MaskBias_0"][name]
    chex.assert_shape(stored, (3, HEADS, LENGTH))
    np.testing.assert_array_equal(stored[2], RELATIVE.astype(np.float32))
    out, _ = stack.apply(variables, x, None)
    chex.assert_shape(out, x.shape)
    assert np.all(np.isfinite(out))
    grads = jax.grad(lambda p: jnp.sum(stack.apply({**variables, "params": p}, x, None)[0] ** 2))(variables["params"])
    if mask_collection == "params":
        np.testing.assert_array_equal(grads["MaskBias_0"]["fixed_mask_logits"], 0.0)


class BidirectionalEncoder(nn.Module):
    """A non-causal host (no mask): the relative mask keeps a logit per future offset."""

    @nn.compact
    def __call__(self, x):
        attention_fn = MaskBias(HEADS, LENGTH, mask_init=BIDIRECTIONAL, mask_structure="toeplitz", causal=False)()
        return nn.MultiHeadDotProductAttention(num_heads=HEADS, attention_fn=attention_fn)(x)


def test_a_non_causal_host_with_a_relative_mask_matches_the_reference_at_two_lengths():
    x = jax.random.normal(jax.random.key(5), (2, LENGTH, FEATURES))
    variables = BidirectionalEncoder().init(jax.random.key(6), x)
    chex.assert_shape(variables["params"]["MaskBias_0"]["mask_logits"], (HEADS, 2 * LENGTH - 1))
    p = jax.tree.map(lambda a: np.asarray(a, np.float64), variables["params"]["MultiHeadDotProductAttention_0"])
    for length in (LENGTH, 3):
        x64 = np.asarray(x[:, :length], np.float64)
        q, k, v = (np.einsum("bld,dhe->blhe", x64, p[n]["kernel"]) + p[n]["bias"] for n in ("query", "key", "value"))
        out = reference_attention(q, k, v, reference_bias(BIDIRECTIONAL, range(length), length, causal=False))
        expected = np.einsum("blhe,hed->bld", out, p["out"]["kernel"]) + p["out"]["bias"]
        got = BidirectionalEncoder().apply(variables, x[:, :length])
        np.testing.assert_allclose(np.asarray(got), expected, rtol=2e-5, atol=2e-5)
