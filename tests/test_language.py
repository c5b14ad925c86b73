"""The language study: the relative mask against dense references, causality, the scores, seeds in a batch,
and the CLI end to end on a tiny corpus."""

import dataclasses
import json
import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from golden_check import assert_matches_golden

from maskjax.attention import alibi_bias, toeplitz_logits
from maskjax.methods import get_method
from maskjax.models.causal import CausalTransformer
from maskjax.models.layers import ModelConfig
from maskjax.studies import language as study
from maskjax.tasks import language as lt
from maskjax.train import RunState

TINY = ModelConfig(dim=16, depth=2, heads=2, head_dim=8, mlp_dim=16)


def test_toeplitz_expansion_equals_a_dense_reference():
    relative = np.random.default_rng(0).normal(size=(3, 7))
    expanded = np.asarray(toeplitz_logits(jnp.asarray(relative), 5, 7), np.float64)
    reference = np.empty((3, 5, 7))
    for i in range(5):
        for j in range(7):
            reference[:, i, j] = relative[:, max(i + 2 - j, 0)]
    np.testing.assert_allclose(expanded, reference, rtol=1e-6)


def test_alibi_matches_its_published_slopes():
    bias = alibi_bias(4, 5)
    chex.assert_shape(bias, (4, 5, 5))
    np.testing.assert_allclose(bias[:, 4, 1], -3 * np.array([2**-2, 2**-4, 2**-6, 2**-8]))
    assert np.all(bias[:, 1, 3] == 0)


def test_the_window_init_opens_each_head_to_its_reach():
    m = lt.relative_mask_logits(3, 20)
    np.testing.assert_allclose(lt.window_widths(3), [2, 4, 8])
    np.testing.assert_allclose(m[:, 0], 1.0)
    np.testing.assert_allclose([m[h, int(w)] for h, w in enumerate(lt.window_widths(3))], 0.0, atol=1e-7)
    assert np.all(np.diff(m, axis=1) < 0)
    assert set(np.unique(lt.relative_mask_logits(2, 6, "binary"))) == {-1.0, 1.0}
    with pytest.raises(ValueError, match="unknown mask init"):
        lt.relative_mask_logits(2, 6, "gaussian")


@pytest.mark.parametrize(
    "options",
    [
        {"mask_mode": "learnable", "mask_structure": "toeplitz", "mask_scale": 10.0},
        {"mask_mode": "learnable", "mask_structure": "full", "mask_scale": 10.0},
        {"mask_mode": "learnable", "mask_structure": "toeplitz", "share_mask": True},
        {"position_bias": "alibi"},
    ],
)
def test_no_future_token_changes_a_prediction(options):
    context = 8
    init = lt.relative_mask_logits(2, context)
    if options.get("mask_structure") == "full":
        init = init[:, np.clip(np.arange(context)[:, None] - np.arange(context)[None, :], 0, None)]
    model = CausalTransformer(50, context, TINY, mask_init=init if "mask_mode" in options else None, **options)
    tokens = jax.random.randint(jax.random.key(0), (2, context), 0, 50)
    variables = model.init(jax.random.key(1), tokens)
    changed = tokens.at[:, 5:].set((tokens[:, 5:] + 7) % 50)
    before, after = model.apply(variables, tokens), model.apply(variables, changed)
    np.testing.assert_array_equal(np.asarray(before[:, :5]), np.asarray(after[:, :5]))
    assert not np.allclose(before[:, 5:], after[:, 5:])


def test_a_toeplitz_mask_shares_one_logit_per_head_and_distance():
    model = CausalTransformer(20, 6, TINY, "learnable", lt.relative_mask_logits(2, 6), mask_structure="toeplitz")
    params = model.init(jax.random.key(0), jnp.zeros((1, 6), jnp.int32))["params"]
    chex.assert_shape(params["block_0"]["attn"]["mask_logits"], (2, 6))
    shared = CausalTransformer(20, 6, TINY, "learnable", lt.relative_mask_logits(2, 6), mask_structure="toeplitz",
                               share_mask=True)
    shared_params = shared.init(jax.random.key(0), jnp.zeros((1, 6), jnp.int32))["params"]
    assert "mask_logits" not in shared_params["block_0"]["attn"]
    chex.assert_shape(shared_params["shared_mask"]["mask_logits"], (2, 6))


def test_the_distance_profile_of_a_full_mask_matches_numpy():
    mask = np.random.default_rng(1).normal(size=(2, 3, 5, 5)).astype(np.float32)
    config = study.PRESETS["test"]
    model = study.make_model(10, get_method("mask_full"), config)
    collection = {f"block_{i}": {"attn": {"mask_logits": jnp.asarray(mask[i])}} for i in range(2)}
    profile = study.mask_profiles(model, get_method("mask_full"), {"params": collection})
    np.testing.assert_allclose(np.asarray(profile), lt.relative_profile(mask.astype(np.float64)), rtol=1e-6)


def test_packing_predicts_every_stream_token_once():
    stream = lt.token_stream([[5, 6, 7], [8, 9]], eos_id=0)
    np.testing.assert_array_equal(stream, [0, 5, 6, 7, 0, 8, 9, 0])
    windows, weights = lt.pack(stream, 3)
    np.testing.assert_array_equal(windows[:, 1:][weights > 0], stream[1:])
    assert weights.sum() == len(stream) - 1
    train, _ = lt.pack(stream, 3, keep_partial=False)
    assert len(train) == 2
    assert lt.split_bytes(["ab", "é"]) == 2 + 1 + 2 + 1


def test_scores_against_hand_computed_values():
    assert lt.perplexity(2 * math.log(4.0), 2) == pytest.approx(4.0)
    assert lt.bits_per_byte(8 * math.log(2), 4) == pytest.approx(2.0)


def test_the_test_score_is_the_weighted_nll_of_a_float64_reference():
    config = study.PRESETS["test"]
    rng = np.random.default_rng(0)
    windows, weights = lt.pack(rng.integers(0, 30, 40).astype(np.int32), config.context)
    model = study.make_model(30, get_method("vanilla"), config)
    variables = model.init(jax.random.key(0), jnp.asarray(windows[:1, :-1]))
    one_run = RunState(jax.tree.map(lambda a: a[None], variables["params"]), {}, None, None)
    nll, tokens = study.score(model, one_run, windows, weights, 3)
    logits = np.asarray(model.apply(variables, jnp.asarray(windows[:, :-1])), np.float64)
    logp = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True)) - logits.max(
        -1, keepdims=True
    )
    reference = -(np.take_along_axis(logp, windows[:, 1:, None], -1)[..., 0] * weights).sum()
    assert tokens == weights.sum() == 39
    np.testing.assert_allclose(nll[0], reference, rtol=1e-5)


@pytest.fixture(scope="module")
def tiny_data():
    rng = np.random.default_rng(0)
    config = study.PRESETS["test"]

    def split(n, keep):
        return lt.pack(rng.integers(0, 40, n).astype(np.int32), config.context, keep_partial=keep)

    return study.LanguageData("tiny", "none", 40, split(200, False)[0], *split(40, True), *split(50, True), 120)


def test_a_seed_in_a_batch_equals_the_seed_alone(tiny_data):
    config = study.PRESETS["test"]
    together, maps = study.STUDY.run(config, study.LanguageGroup(tiny_data, get_method("mask")), [0, 1])
    alone, _ = study.STUDY.run(config, study.LanguageGroup(tiny_data, get_method("mask")), [1])
    assert together[1]["test_ppl"] == pytest.approx(alone[0]["test_ppl"], rel=1e-6)
    assert together[1]["val_loss"] == pytest.approx(alone[0]["val_loss"], rel=1e-6)
    assert together[0]["test_ppl"] != together[1]["test_ppl"]
    chex.assert_shape(maps["mask_final"], (2, 2, config.context))
    assert together[0]["test_tokens"] == 49 and together[0]["test_bpb"] > 0


@pytest.fixture
def tiny_text(tmp_path):
    words = "the cat sat on the mat and a dog ran to the park while birds sang".split()
    rng = np.random.default_rng(0)
    stories = [" ".join(rng.choice(words, 30)) for _ in range(30)]
    path = tmp_path / "stories.txt"
    path.write_text("\n<|endoftext|>\n".join(stories))
    return path


def test_cli_writes_every_output(cli, tmp_path, tiny_text):
    out = tmp_path / "run"
    result = cli("experiments.language", "--corpus=text", f"--data-dir={tiny_text}", "--preset=test", "--seeds=2",
                 "--methods=vanilla,mask", f"--cache={tmp_path / 'cache'}", f"--out={out}")
    assert result.returncode == 0, result.stderr
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert [(r["method"], r["seed"]) for r in records] == [("vanilla", 0), ("vanilla", 1), ("mask", 0), ("mask", 1)]
    assert all(r["test_ppl"] > 1 and r["test_bpb"] > 0 and r["git_commit"] and r["devices"] for r in records)
    assert len(records[2]["mask_change_mean"]) == 3 and "mask_change_mean" not in records[0]
    for name in ("summary.md", "config.json", "curves.png", "persistence.png", "bias_mask.png"):
        assert (out / name).exists(), name
    assert "sign test" in (out / "summary.md").read_text()
    assert list((tmp_path / "cache").glob("bpe-*.json"))
    assert_matches_golden(records, "language")  # pinned before the study interface moves (issue 30)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--corpus=shakespeare"], "invalid choice"),
        (["--methods=vanilla,impulse"], "not defined for the language study"),
        (["--scale=0"], "expected a finite number > 0"),
        (["--scale=-10"], "expected a finite number > 0"),
        (["--context=16", "--max-positions=8"], "longer than the position table"),
        (["--data-dir=/nonexistent/stories.txt"], "/nonexistent/stories.txt"),
    ],
)
def test_cli_bad_input_is_one_line_and_exit_2(main, tmp_path, args, message):
    result = main("experiments.language", "--corpus=text", "--preset=test", f"--out={tmp_path / 'o'}", *args)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert message in lines[-1] and lines[-1].startswith("error:") and "Traceback" not in result.stderr
    assert [line for line in lines if line.startswith("error")] == lines[-1:]


def test_an_empty_text_file_is_refused(main, tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("  \n")
    result = main("experiments.language", "--corpus=text", f"--data-dir={empty}", "--preset=test",
                  f"--out={tmp_path / 'o'}")
    assert result.returncode == 2 and "Traceback" not in result.stderr


def test_other_studies_refuse_alibi():
    from maskjax.studies import arithmetic, boolean

    for study_module in (boolean, arithmetic):
        other = study_module.STUDY
        with pytest.raises(ValueError, match=f"not defined for the {other.name} study"):
            other.resolve_methods(["alibi"], other.preset("test"), other.scope_type())


def test_the_ngram_floors_against_hand_counts():
    train = np.array([0, 1, 2, 1, 2, 0])
    unigram = np.log(np.array([3, 3, 3]) / 9)
    np.testing.assert_allclose(lt.unigram_logprobs(train, 3), unigram)
    # p(2 | 1) = 0.5 * c(1, 2) / c(1) + 0.5 * p(2) = 0.5 * 1 + 0.5 / 3; p(0 | 2) = 0.5 * 1 / 2 + 0.5 / 3
    expected = -np.log(0.5 + 0.5 / 3) - np.log(0.25 + 0.5 / 3)
    assert lt.bigram_nll(train, np.array([1, 2, 0]), 3, 0.5) == pytest.approx(expected)
    floors = lt.ngram_references(train, train, np.array([1, 2, 0]), 3)
    assert floors["unigram"] == pytest.approx(-2 * unigram[0]) and 0.05 <= floors["bigram_weight"] <= 0.95


def test_ngram_cli_writes_its_floors(cli, tmp_path, tiny_text):
    out = tmp_path / "ngram"
    result = cli("experiments.language_ngram", "--corpus=text", f"--data-dir={tiny_text}", "--preset=test",
                 f"--cache={tmp_path / 'cache'}", f"--out={out}")
    assert result.returncode == 0, result.stderr
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert [r["method"] for r in records] == ["unigram", "bigram"]
    assert records[1]["test_ppl"] < records[0]["test_ppl"] and records[0]["git_commit"]
    assert "| text | bigram |" in (out / "summary.md").read_text()


def test_the_medium_preset_is_the_rung_the_ladder_passed():
    """docs/results/language_ladder.md names `medium`; its config is that run's, field for field. The run
    predates the optimizer fields (the code then hard-wired AdamW with the mask decayed like the rest) and
    the QK-prior fields of issue 44, which no method of that run reads, and the model's attention path of
    issue 48."""
    from pathlib import Path

    ran = json.loads((Path(__file__).parent.parent / "docs/results/language_ladder/l128d4/config.json").read_text())
    ran = {"optimizer": "adamw", "mask_weight_decay": None, "qk_opt_steps": 10_000, "qk_position_scale": 5.0, **ran}
    from maskjax.runner import field_defaults, without_added

    preset = study.STUDY.preset("medium")
    medium = without_added(json.loads(json.dumps(dataclasses.asdict(preset))), ran, field_defaults(preset))
    assert "attention_impl" not in medium["model"]  # added since (issue 48), at its default
    assert {k: v for k, v in medium.items() if k != "preset"} == {k: ran[k] for k in medium if k != "preset"}


def test_the_test_windows_are_arguments_of_the_scoring_program_not_constants_in_it(monkeypatch):
    """Two test sets of one shape lower to the same program: the windows are not baked into it (at
    TinyStories or WikiText-2 size a constant would slow the compile and fill the compilation cache)."""
    config = study.PRESETS["test"]
    model = study.make_model(30, get_method("vanilla"), config)
    windows, weights = lt.pack(np.arange(40, dtype=np.int32) % 30, config.context)
    variables = model.init(jax.random.key(0), jnp.asarray(windows[:1, :-1]))
    one_run = RunState(jax.tree.map(lambda a: a[None], variables["params"]), {}, None, None)
    programs, real_jit = [], jax.jit

    def spy(fun, *args, **kwargs):
        jitted = real_jit(fun, *args, **kwargs)

        def call(*inputs):
            programs.append(jitted.lower(*inputs).as_text())
            return jitted(*inputs)

        return call

    monkeypatch.setattr(jax, "jit", spy)
    study.score(model, one_run, windows, weights, 3)
    study.score(model, one_run, (windows + 7) % 30, weights, 3)
    assert len(programs) == 2 and programs[0] == programs[1]


def test_matched_alibi_slopes_follow_the_windows_tail_and_reach_the_model():
    config = study.PRESETS["test"]  # 2 heads: windows 2 and 4, scale 10
    assert study.matched_slopes(config) == (5.0, 2.5)
    model = study.make_model(40, get_method("alibi_matched"), config)
    assert model.position_bias == "alibi" and model.alibi_slopes == (5.0, 2.5)
    assert study.make_model(40, get_method("alibi"), config).alibi_slopes is None  # the paper's slopes
    bias = alibi_bias(2, 4, np.asarray([5.0, 2.5]))
    np.testing.assert_allclose(bias[:, 3, 0], [-15.0, -7.5])
    with pytest.raises(ValueError, match="one slope per head"):
        alibi_bias(2, 4, np.ones(3))


@pytest.mark.parametrize("name", ["qk_svd", "qk_opt", "mimetic"])
def test_the_qk_priors_of_the_window_train_in_the_language_study(tiny_data, name):
    """The relative window injected through W_Q W_K (issue 44): the group initialises and trains, and each
    record says how near layer 0's attention starts to the window's (pattern_error_init)."""
    config = study.PRESETS["test"]
    records, _ = study.STUDY.run(config, study.LanguageGroup(tiny_data, get_method(name)), [0])
    assert records[0]["method"] == name and np.isfinite(records[0]["test_bpb"])
    assert 0.0 <= records[0]["pattern_error_init"] <= 1.0
    pattern, target = study.window_prior(config)
    assert pattern.shape == target.shape == (2, config.context, config.context)
    np.testing.assert_allclose(target.sum(-1), 1.0, rtol=1e-6)
    assert not np.any(np.triu(target[0], 1)) and pattern[0, 3, 2] and not pattern[0, 3, 1]  # w_0 = 2


def test_the_svd_prior_starts_nearer_the_window_than_default_init(tiny_data):
    config = study.PRESETS["test"]
    errors = {
        name: study.STUDY.run(config, study.LanguageGroup(tiny_data, get_method(name)), [0])[0][0]["pattern_error_init"]
        for name in ("qk_svd", "vanilla", "mask")
    }
    assert errors["mask"] < errors["qk_svd"] < errors["vanilla"], errors
