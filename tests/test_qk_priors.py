import jax
import jax.numpy as jnp
import numpy as np
import pytest

from maskjax import mask_patterns
from maskjax import qk_priors as qp


def numpy_layer_norm(x):
    return (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5)


def numpy_attention(x, q, k):
    logits = np.einsum("nhe,mhe->hnm", np.einsum("nd,dhe->nhe", x, q), np.einsum("nd,dhe->nhe", x, k))
    logits = logits / np.sqrt(q.shape[-1])
    p = np.exp(logits - logits.max(-1, keepdims=True))
    return p / p.sum(-1, keepdims=True)


def oracle(n_heads=2):
    pattern = mask_patterns.group_pattern(15, ((0, 1),))
    target = mask_patterns.row_distribution(mask_patterns.mask_logits(pattern, 10.0, -10.0))
    return np.broadcast_to(pattern, (n_heads, 16, 16)), np.broadcast_to(target, (n_heads, 16, 16))


def test_svd_qk_against_a_numpy_construction_and_on_the_pseudo_input():
    pattern, target = oracle()
    positions = np.random.default_rng(0).normal(size=(16, 32))
    q, k = map(np.asarray, qp.svd_qk(jax.random.key(1), pattern, positions, 16, noise=0.0))
    assert q.shape == k.shape == (32, 2, 16)
    np.testing.assert_allclose(np.linalg.norm(q[:, 0]), 7.0, rtol=1e-5)
    # Independent numpy: pe+ (1000 H) pe+^T has the same rank-16 product, up to the Frobenius scalings.
    pe = numpy_layer_norm(positions)
    pinv = np.linalg.pinv(pe)
    a = pinv @ (1000.0 * pattern[0]) @ pinv.T
    product = q[:, 0] @ k[:, 0].T
    np.testing.assert_allclose(product / np.linalg.norm(product), a / np.linalg.norm(a), atol=2e-4)
    with_noise = [np.asarray(m) for m in qp.svd_qk(jax.random.key(1), pattern, positions, 16)]
    assert qp.pattern_error(numpy_attention(pe, *with_noise), target) < 0.01
    again = qp.svd_qk(jax.random.key(1), pattern, positions, 16)
    np.testing.assert_array_equal(with_noise[0], np.asarray(again[0]))
    assert not np.array_equal(with_noise[0], np.asarray(qp.svd_qk(jax.random.key(2), pattern, positions, 16)[0]))


def test_mimetic_qk_is_the_truncated_svd_of_noise_plus_identity():
    q, k, a = map(np.asarray, qp.mimetic_factors(jax.random.key(0), 8, 2, 8))
    np.testing.assert_allclose(np.einsum("dhe,fhe->hdf", q, k), a, atol=1e-5)
    noise = a - 0.7 * np.eye(8)
    assert np.abs(noise).max() <= 0.7 * np.sqrt(3 / 8) + 1e-6
    q, k, a = map(np.asarray, qp.mimetic_factors(jax.random.key(0), 8, 1, 3))
    u, s, vt = np.linalg.svd(a[0].astype(np.float64))
    np.testing.assert_allclose(q[:, 0] @ k[:, 0].T, u[:, :3] @ np.diag(s[:3]) @ vt[:3], atol=1e-5)
    _, _, value_out = qp.mimetic_factors(jax.random.key(0), 8, 1, 8, alpha=0.4, beta=0.4, sign=-1.0)
    assert np.trace(np.asarray(value_out)[0]) < 0


def test_optimised_qk_lowers_its_loss_and_is_a_function_of_the_key():
    _, target = oracle()
    x = numpy_layer_norm(np.random.default_rng(0).normal(size=(16, 32)))
    q0, k0 = qp.optimised_qk(jax.random.key(0), target, x, 16, steps=0)
    q, k = qp.optimised_qk(jax.random.key(0), target, x, 16, steps=300, learning_rate=1e-2)
    before = np.mean((numpy_attention(x, np.asarray(q0), np.asarray(k0)) - target) ** 2)
    after = np.mean((numpy_attention(x, np.asarray(q), np.asarray(k)) - target) ** 2)
    assert after < 0.5 * before
    np.testing.assert_array_equal(
        np.asarray(q), np.asarray(qp.optimised_qk(jax.random.key(0), target, x, 16, steps=300, learning_rate=1e-2)[0])
    )


def test_impulse_offsets_and_border_rows():
    grid = 3
    p = mask_patterns.impulse_patterns(grid, 10)
    assert p.shape == (10, 9, 9) and np.all(p.sum(-1) <= 1)
    np.testing.assert_array_equal(p[0], np.eye(9, dtype=bool))  # offset 4: the centre
    np.testing.assert_array_equal(p[9], p[0])  # head 9 wraps to the first offset
    assert p[1, 1 * grid + 1, 0 * grid + 1]  # head 1, offset 1 = (-1, 0): one row up
    assert not p[1, 0 * grid + 2].any()  # top row: off the zero-padded grid, no open entry
    assert p[1].sum() == grid * (grid - 1)
    assert p[5, 2 * grid + 2, 1 * grid + 1] and not p[5, 1 * grid + 0].any()  # offset 0 = (-1, -1)


def test_pattern_error_worked_example_and_row_distribution():
    target = np.array([[[0.5, 0.5], [0.0, 1.0]]])
    attention = np.array([[[1.0, 0.0], [0.0, 1.0]]])
    assert qp.pattern_error(attention, target) == pytest.approx(0.25)
    rows = mask_patterns.row_distribution(np.array([[10.0, -10.0], [0.0, 0.0]]))
    np.testing.assert_allclose(rows.sum(-1), 1.0)
    assert rows[0, 0] == pytest.approx(1 / (1 + np.exp(-10.0)), rel=1e-4) and rows[1, 0] == 0.5


@pytest.mark.parametrize("task_name", ["2parity", "cyclic3"])
def test_qk_priors_match_their_target_at_init_in_the_model(task_name):
    from maskjax.methods import get_method
    from maskjax.studies import boolean as study

    config = study.STUDY.preset("quick")
    task = study.get_task(task_name)
    errors = {}
    for name in ("vanilla", "qk_svd", "qk_opt", "mimetic"):
        # the same numbers as run_group's records (the next test), without training or scoring the cube
        errors[name] = study.init_pattern_errors(task, get_method(name), [0, 1], config)
        assert all(0.0 <= e <= 1.0 for e in errors[name])
    assert max(errors["qk_svd"]) <= 0.2 and max(errors["qk_opt"]) <= 0.2
    assert min(errors["vanilla"]) > 0.5 and min(errors["mimetic"]) > 0.4


def test_init_pattern_errors_equal_the_training_records_and_the_cli_writes_them(cli, main, tmp_path):
    import dataclasses

    from maskjax.methods import get_method
    from maskjax.studies import boolean as study
    from maskjax.tasks.boolean import get_task

    config = dataclasses.replace(study.STUDY.preset("test"), steps=5)
    task, method = get_task("2parity"), get_method("qk_svd")
    records, _ = study.STUDY.run(config, study.BooleanGroup(task, method), [0, 1])
    errors = study.init_pattern_errors(task, method, [0, 1], config)
    assert errors == pytest.approx([r["pattern_error_init"] for r in records], abs=1e-6)
    result = cli("experiments.qk_match", "--preset=test", "--seeds=1", "--tasks=2parity", f"--out={tmp_path / 'q'}")
    assert result.returncode == 0, result.stderr
    assert "| 2parity | mask | 1 | 0 |" in (tmp_path / "q" / "summary.md").read_text()
    bad = main("experiments.qk_match", "--preset=test", "--methods=nope", f"--out={tmp_path / 'r'}")
    assert bad.returncode == 2 and "unknown method 'nope'" in bad.stderr


@pytest.mark.parametrize("d, heads, head_dim", [(8, 2, 4), (8, 3, 4), (8, 1, 4)])
def test_shared_value_output_is_one_matrix_for_all_heads(d, heads, head_dim):
    v, o, a = map(np.asarray, qp.shared_value_output(jax.random.key(0), d, heads, head_dim))
    assert v.shape == (d, heads, head_dim) and o.shape == (heads, head_dim, d)
    product = v.reshape(d, -1).astype(np.float64) @ o.reshape(-1, d).astype(np.float64)
    if heads * head_dim >= d:
        np.testing.assert_allclose(product, a, atol=1e-5)
    else:
        u, s, vt = np.linalg.svd(np.asarray(a, np.float64))
        best = (u[:, :4] * s[:4]) @ vt[:4]
        np.testing.assert_allclose(product, best, atol=1e-5)
    noise = (a + 0.4 * np.eye(d)) / 0.4
    assert np.abs(noise).max() <= np.sqrt(3.0 / d) + 1e-6


def test_qk_prior_finds_attention_modules_by_key_path():
    layer = {"qkv": {"kernel": jnp.zeros((8, 3, 2, 4))}, "out": {"kernel": jnp.zeros((2, 4, 8))}}
    params = {
        "encoder": {f"block_{i}": {"attn": layer, "mlp": {"kernel": jnp.ones(3)}} for i in (10, 2, 1)},
        "embed": {"pos_embed": jax.random.normal(jax.random.key(1), (5, 8))},
    }
    assert qp.attention_paths(params) == [("encoder", f"block_{i}", "attn") for i in (1, 2, 10)]
    assert qp.position_path(params) == ("embed", "pos_embed")
    pattern = jnp.broadcast_to(jnp.eye(5), (2, 5, 5))
    new = qp.with_qk_prior(params, jax.random.key(0), "svd", pattern, pattern)
    np.testing.assert_allclose(new["embed"]["pos_embed"], 5.0 * params["embed"]["pos_embed"])
    for i in (1, 2, 10):
        assert np.abs(np.asarray(new["encoder"][f"block_{i}"]["attn"]["qkv"]["kernel"][:, :2])).sum() > 0
        np.testing.assert_array_equal(new["encoder"][f"block_{i}"]["mlp"]["kernel"], 1.0)
    with pytest.raises(ValueError, match="pos_embed"):
        qp.with_qk_prior({"block_0": {"attn": layer}}, jax.random.key(0), "svd", pattern, pattern)
