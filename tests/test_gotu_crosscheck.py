"""The PyTorch GOTU transformer computes maskjax's function once given its parameters, and the cross-check CLI
that trains it on 2Parity."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")

from benchmarks import gotu_crosscheck, torch_gotu  # noqa: E402
from maskjax.errors import ConfigError  # noqa: E402
from maskjax.methods import get_method  # noqa: E402
from maskjax.models.gotu import GotuTransformer  # noqa: E402
from maskjax.models.layers import ModelConfig  # noqa: E402
from maskjax.studies import boolean  # noqa: E402
from maskjax.tasks.boolean import cube, two_parity  # noqa: E402

N_BITS = 6
CONFIG = ModelConfig(dim=16, depth=2, heads=2, head_dim=8, mlp_dim=16)
TASK = two_parity(N_BITS)


def pair(method_name: str, qk_norm: bool = False):
    """maskjax's GotuTransformer with the method's 2Parity oracle mask (+-10), its variables, and the PyTorch
    model of the same shape. maskjax's functions are jitted: one compilation costs less than eager dispatch."""
    method = get_method(method_name)
    mask = None if method.mask_mode == "none" else boolean.task_mask_logits(TASK, method, boolean.STUDY.preset("test"))
    model = GotuTransformer(N_BITS, CONFIG, method.mask_mode, mask, qk_norm)
    variables = jax.jit(model.init)(jax.random.key(0), jnp.ones((1, N_BITS)))
    dims = (CONFIG.dim, CONFIG.depth, CONFIG.heads, CONFIG.head_dim, CONFIG.mlp_dim)
    peer = torch_gotu.gotu_model(N_BITS, *dims, mask, method.mask_mode == "learnable")
    return model, variables, peer


@pytest.mark.parametrize("method", ["vanilla", "mask", "mask_fixed"])
def test_torch_model_computes_maskjax_function_on_the_whole_cube(method):
    model, variables, peer = pair(method)
    torch_gotu.load_flax_params(peer, variables, CONFIG.depth)
    x = cube(N_BITS).astype(np.float32)
    expected = np.asarray(jax.jit(model.apply)(variables, jnp.asarray(x)))
    got = peer(torch.from_numpy(x)).detach().numpy()
    assert np.abs(expected).max() > 0.1
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-5)


def test_mask_gradients_agree_with_jax():
    """d MSE / d M per layer, torch autograd against jax.grad, on the seen points as one batch."""
    model, variables, peer = pair("mask")
    torch_gotu.load_flax_params(peer, variables, CONFIG.depth)
    points = cube(N_BITS).astype(np.float32)
    seen = TASK.seen(points)
    x, y = points[seen], TASK.target(points)[seen]

    def loss(params):
        return jnp.mean((model.apply({"params": params}, jnp.asarray(x)) - jnp.asarray(y)) ** 2)

    grads = jax.jit(jax.grad(loss))(variables["params"])
    torch.mean((peer(torch.from_numpy(x)) - torch.from_numpy(y)) ** 2).backward()
    for i, (attention, _) in enumerate(peer.transformer.layers):
        expected = np.asarray(grads[f"block_{i}"]["attn"]["mask_logits"])
        got = attention.fn.mask_logits.grad.numpy()
        scale = np.abs(expected).max()
        assert scale > 0
        np.testing.assert_allclose(got, expected, rtol=0, atol=1e-4 * scale)


def test_a_variable_without_a_torch_counterpart_is_refused():
    _, variables, peer = pair("vanilla", qk_norm=True)
    with pytest.raises(ConfigError, match="q_norm"):
        torch_gotu.load_flax_params(peer, variables, CONFIG.depth)


def test_corner_fit_reads_t_off_a_function_of_the_first_two_bits():
    points = cube(4).astype(np.float64)
    x0, x1 = points[:, 0], points[:, 1]
    t = 0.3
    pred = (t - 1) + (1 - t) * (x0 + x1) + t * x0 * x1 + points[:, 2] * points[:, 3]
    fit = gotu_crosscheck.corner_fit(points, pred)
    assert fit["pair_coefficient"] == pytest.approx(t)
    assert fit["unseen_from_t"] == pytest.approx(fit["unseen_mean_prediction"]) == pytest.approx(4 * t - 3)


def test_crosscheck_cli_prints_a_row_per_method_and_seed_and_writes_its_files(cli, tmp_path):
    args = ("--preset=test", "--seeds=1", "--methods=vanilla,mask", f"--out={tmp_path}")
    result = cli("benchmarks.gotu_crosscheck", *args)
    assert result.returncode == 0, result.stderr
    assert "| method | seed | acc_all (%) | acc_unseen (%) | train_loss | t | 4t-3 | unseen mean |" in result.stdout
    records = json.loads(result.stdout.strip().splitlines()[-1])["records"]
    assert [(r["method"], r["seed"], r["steps"]) for r in records] == [("vanilla", 0, 10), ("mask", 0, 10)]
    for r in records:
        assert 0 <= r["acc_all"] <= 1 and np.isfinite(r["pair_coefficient"]) and r["git_commit"] and r["torch_version"]
        assert f"| {r['method']} | 0 |" in result.stdout
    written = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert written == records and "| method | seeds |" in (tmp_path / "summary.md").read_text()


@pytest.mark.parametrize(
    ("args", "expected"),
    [(["--seeds=0"], "--seeds"), (["--methods=vanilla_qknorm"], "QK-LayerNorm"), (["--methods=qk_svd"], "--init")],
)
def test_crosscheck_cli_refuses_bad_input_in_one_line(main, args, expected):
    result = main("benchmarks.gotu_crosscheck", "--preset=test", *args)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and lines[0].startswith("error:") and expected in lines[0]
