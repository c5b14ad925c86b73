"""Properties every attention path must keep for any shape, head count, q_len <= kv_len, layout, dtype and
mask structure, held against one float64 numpy reference: the paths agree (including causal attention with
fewer queries than keys, query i at key position kv_len - q_len + i), a uniform mask changes nothing, and
the mask's gradient is the paper's closed form."""

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn
from flax import nnx
from hypothesis import given, settings
from hypothesis import strategies as st

import maskjax
from maskjax.attention import fused_attention, masked_attention

SETTINGS = settings(max_examples=20, deadline=None, derandomize=True)
TOLERANCE = {"float32": 2e-5, "bfloat16": 2e-2}


@st.composite
def problems(draw):
    """q [B, Q, H, D], k and v [B, K, H, D], a stored mask of the drawn structure and the dense [H, Q, K]
    logits it means for queries at the last Q positions, and whether attention is causal."""
    batch, heads, dim = draw(st.integers(1, 2)), draw(st.integers(1, 3)), draw(st.integers(1, 8))
    kv_len = draw(st.integers(1, 6))
    q_len = draw(st.integers(1, kv_len))
    structure, causal = draw(
        st.sampled_from([("full", False), ("full", True), ("toeplitz", True), ("toeplitz", False)])
    )
    dtype = draw(st.sampled_from(["float32", "bfloat16"]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    q, k, v = (rng.normal(size=(batch, n, heads, dim)) for n in (q_len, kv_len, kv_len))
    positions = np.arange(kv_len - q_len, kv_len)
    offsets = positions[:, None] - np.arange(kv_len)[None, :]
    if structure == "full":
        stored = rng.normal(scale=3.0, size=(heads, kv_len, kv_len))
        dense = stored[:, positions]
    elif causal:
        stored = rng.normal(scale=3.0, size=(heads, kv_len))
        dense = stored[:, np.clip(offsets, 0, kv_len - 1)]
    else:
        stored = rng.normal(scale=3.0, size=(heads, 2 * kv_len - 1))
        dense = stored[:, offsets + kv_len - 1]
    cast = lambda a: np.asarray(jnp.asarray(a, dtype).astype(jnp.float32), np.float64)  # noqa: E731
    return {
        "q": cast(q),
        "k": cast(k),
        "v": cast(v),
        "stored": stored.astype(np.float32),
        "dense": dense.astype(np.float32),
        "structure": structure,
        "causal": causal,
        "dtype": dtype,
    }


def log_sigmoid(m):
    return -np.logaddexp(0.0, -np.asarray(m, np.float64))


def reference(q, k, v, dense_HQK, causal, extra=0.0):
    """softmax(q.k / sqrt(d) + log_sigmoid(M) + extra) v in float64, query i at key kv_len - q_len + i."""
    logits = np.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(q.shape[-1]) + log_sigmoid(dense_HQK) + extra
    q_len, kv_len = logits.shape[-2:]
    if causal:
        logits = np.where(np.tri(q_len, kv_len, kv_len - q_len, bool), logits, -np.inf)
    weights = np.exp(logits - logits.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    return np.einsum("bhqk,bkhd->bqhd", weights, v)


def inputs(p):
    return (jnp.asarray(p[name], p["dtype"]) for name in ("q", "k", "v"))


def check(out, expected, dtype):
    np.testing.assert_allclose(np.asarray(out, np.float64), expected, atol=TOLERANCE[dtype], rtol=TOLERANCE[dtype])


def visible(p):
    """The host's own causal mask, bottom-right, as a Flax mask [1, 1, Q, K] (None when not causal)."""
    q_len, kv_len = p["q"].shape[1], p["k"].shape[1]
    return jnp.asarray(np.tri(q_len, kv_len, kv_len - q_len, bool))[None, None] if p["causal"] else None


@SETTINGS
@given(problems())
def test_the_einsum_and_fused_paths_agree_with_the_reference(p):
    expected = reference(p["q"], p["k"], p["v"], p["dense"], p["causal"])
    q, k, v = inputs(p)
    check(masked_attention(q, k, v, p["dense"], causal=p["causal"]), expected, p["dtype"])
    check(fused_attention(q, k, v, p["dense"], causal=p["causal"]), expected, p["dtype"])
    per_example = np.random.default_rng(0).normal(size=(p["q"].shape[0], *p["dense"].shape))
    with_bias = reference(p["q"], p["k"], p["v"], p["dense"], p["causal"], per_example)
    check(fused_attention(q, k, v, p["dense"], causal=p["causal"], bias=per_example), with_bias, p["dtype"])


@SETTINGS
@given(problems())
def test_the_drop_in_biases_agree_with_the_reference(p):
    expected = reference(p["q"], p["k"], p["v"], p["dense"], p["causal"])
    q, k, v = inputs(p)
    heads, kv_len = p["q"].shape[2], p["k"].shape[1]
    positions = jnp.arange(kv_len - p["q"].shape[1], kv_len)
    options = {"mask_init": p["stored"], "mask_structure": p["structure"], "causal": p["causal"]}
    module = maskjax.MaskBias(heads, kv_len, **options)
    variables = module.init(jax.random.key(0), positions)
    attention_fn = module.apply(variables, positions)
    check(attention_fn(q, k, v, mask=visible(p)), expected, p["dtype"])
    nnx_bias = maskjax.NNXMaskBias(heads, kv_len, **options, rngs=nnx.Rngs(0))
    check(nnx_bias(q, k, v, mask=visible(p), query_positions=positions), expected, p["dtype"])


@SETTINGS
@given(problems(), st.sampled_from(["BHQK", "BTNS"]))
def test_add_attention_bias_agrees_with_the_reference_in_either_layout(p, layout):
    expected = reference(p["q"], p["k"], p["v"], p["dense"], p["causal"])
    q, k, v = (jnp.asarray(p[name]) for name in ("q", "k", "v"))
    logits = jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(q.shape[-1])
    if layout == "BTNS":
        logits = logits.transpose(0, 2, 1, 3)
    biased = maskjax.add_attention_bias(
        logits,
        p["stored"],
        layout=layout,
        mask_structure=p["structure"],
        causal=p["causal"],
        query_positions=None if p["structure"] == "toeplitz" else jnp.arange(k.shape[1] - q.shape[1], k.shape[1]),
    )
    if layout == "BTNS":
        biased = biased.transpose(0, 2, 1, 3)
    mask = visible(p)
    weights = jax.nn.softmax(biased, axis=-1, where=True if mask is None else mask)
    check(jnp.einsum("bhqk,bkhd->bqhd", weights, v), expected, "float32")


@SETTINGS
@given(problems())
def test_a_uniform_mask_leaves_a_host_unchanged(p):
    """M = 0 shifts every logit of a row by log_sigmoid(0) = -log 2, which the softmax removes: a pretrained
    host with the mask added computes what it did, and the mask's gradient is not vanishing."""
    heads, dim = p["q"].shape[2], p["q"].shape[2] * p["q"].shape[3]
    kv_len = p["k"].shape[1]
    x = jnp.asarray(np.random.default_rng(1).normal(size=(p["k"].shape[0], kv_len, dim)), jnp.float32)
    uniform = np.zeros(maskjax.attention.mask_shape(p["structure"], heads, kv_len, p["causal"]), np.float32)
    mask = visible({**p, "q": p["k"]})
    plain = nn.MultiHeadDotProductAttention(num_heads=heads)
    params = plain.init(jax.random.key(0), x, mask=mask)["params"]

    class Masked(nn.Module):
        @nn.compact
        def __call__(self, x):
            attention_fn = maskjax.MaskBias(
                heads, kv_len, mask_init=uniform, mask_structure=p["structure"], causal=p["causal"], name="bias"
            )()
            return nn.MultiHeadDotProductAttention(num_heads=heads, attention_fn=attention_fn, name="attention")(
                x, mask=mask
            )

    masked = Masked()
    full = maskjax.with_mask_params({"attention": params}, masked.init(jax.random.key(1), x)["params"])
    np.testing.assert_allclose(
        masked.apply({"params": full}, x), plain.apply({"params": params}, x, mask=mask), atol=2e-6
    )
    grads = jax.grad(lambda f: jnp.sum(jnp.sin(masked.apply({"params": f}, x))))(full)
    assert np.abs(np.asarray(grads["bias"]["mask_logits"])).max() > 1e-6 or kv_len == 1


@SETTINGS
@given(st.integers(1, 8), st.integers(0, 2**32 - 1))
def test_the_mask_gradient_is_the_papers_closed_form_and_bounded_by_p(n, seed):
    """d p_i / d m_j = p_i (delta_ij - p_j) sigmoid(-m_j), so |d p_i / d m_j| <= p_i sigmoid(-m_j) whatever
    the query and key norms (the paper's Theorem 1)."""
    rng = np.random.default_rng(seed)
    scores, mask = rng.normal(scale=10.0, size=n), rng.normal(scale=6.0, size=n)
    with jax.enable_x64(True):
        probs = lambda m: jax.nn.softmax(jnp.asarray(scores) + jax.nn.log_sigmoid(m))  # noqa: E731
        jacobian = np.asarray(jax.jacobian(probs)(jnp.asarray(mask, jnp.float64)))
        p = np.asarray(probs(jnp.asarray(mask, jnp.float64)))
    sigmoid = 1.0 / (1.0 + np.exp(mask))
    closed = p[:, None] * (np.eye(n) - p[None, :]) * sigmoid[None, :]
    np.testing.assert_allclose(jacobian, closed, rtol=1e-9, atol=1e-15)
    assert np.all(np.abs(jacobian) <= p[:, None] * sigmoid[None, :] + 1e-15)
