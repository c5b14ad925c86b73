import dataclasses
import json

import jax
import numpy as np
import pytest
from golden_check import assert_matches_golden

from maskjax.methods import get_method
from maskjax.studies import arithmetic as study
from maskjax.tasks.arithmetic import ArithmeticTask


def test_a_seed_in_a_batch_equals_the_seed_alone_and_seeds_differ():
    task, config = ArithmeticTask("add"), study.STUDY.preset("test")
    batch = study.STUDY.run(config, study.ArithmeticGroup(task, 0.004, get_method("mask")), [0, 1, 2])[0]
    alone = study.STUDY.run(config, study.ArithmeticGroup(task, 0.004, get_method("mask")), [2])[0]
    for key in ("seq_acc", "token_acc", "train_seq_acc", "train_loss"):
        assert alone[0][key] == pytest.approx(batch[2][key], rel=1e-4, abs=1e-6), key
    assert batch[0]["train_loss"] != batch[1]["train_loss"]
    assert batch[2]["runs_in_batch"] == 3 and batch[2]["n_train"] == 4000 and batch[2]["eval_size"] == 64


def test_the_training_sample_is_each_seeds_own_training_pairs():
    task = ArithmeticTask("add")
    per_seed = [study.run_data(task, 0.004, seed, 8)[0] for seed in (0, 1)]
    sample = study.training_sample(np.stack(per_seed), [0, 1], 100)
    assert sample.shape == (2, 100, task.length)
    for rows, train in zip(sample, per_seed, strict=True):
        known = {tuple(r) for r in train}
        assert all(tuple(r) in known for r in rows) and len({tuple(r) for r in rows}) == 100
    assert study.training_sample(np.stack(per_seed), [0, 1], 10**6).shape[1] == 4000


def test_greedy_decoding_reads_the_prompt_only():
    task, config = ArithmeticTask("mul"), study.STUDY.preset("test")
    model = study.make_model(task, get_method("vanilla"), config)
    train, held = study.run_data(task, 0.004, 0, 8)
    variables = model.init(jax.random.key(0), train[:1])
    answers = np.asarray(study.greedy_answers(model, variables, held, task.answer_digits))
    scrambled = held.copy()
    scrambled[:, 8:] = 7
    np.testing.assert_array_equal(np.asarray(study.greedy_answers(model, variables, scrambled, 6)), answers)
    assert answers.shape == (8, 6) and answers.max() <= 9


def test_qk_priors_train_through_the_same_registry():
    task, config = ArithmeticTask("add"), study.STUDY.preset("test")
    (record,) = study.STUDY.run(config, study.ArithmeticGroup(task, 0.004, get_method("qk_opt")), [0])[0]
    assert record["method"] == "qk_opt" and not record["diverged"] and np.isfinite(record["train_loss"])


def test_placebo_masks_are_refused_for_arithmetic():
    config, scope = study.STUDY.preset("test"), study.ArithmeticScope(ops=("add",))
    for name in ("mask_random", "mask_learned"):
        with pytest.raises(ValueError, match="not defined for the arithmetic study"):
            study.STUDY.resolve_methods([name], config, scope)


def test_arithmetic_cli_end_to_end(cli, tmp_path):
    out = tmp_path / "a"
    result = cli(
        "experiments.arithmetic",
        "--preset=test",
        "--seeds=2",
        "--ops=add,mul",
        "--train-fractions=0.004",
        "--methods=vanilla,mask",
        f"--out={out}",
        "--set=qk_opt_steps=11",
    )
    assert result.returncode == 0, result.stderr
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert len(records) == 2 * 2 * 2
    for r in records:
        assert {"op", "train_fraction", "method", "seed", "seq_acc", "token_acc", "train_loss", "git_commit"} <= set(r)
        assert 0.0 <= r["seq_acc"] <= r["token_acc"] <= 1.0 and 0.0 <= r["train_seq_acc"] <= 1.0
    error = {(r["op"], r["method"], r["seed"]): r["pattern_error_init"] for r in records}
    for key in error:  # on the answer rows the +5 / -5 mask starts nearer its causal row distribution than vanilla
        if key[1] == "mask":
            assert 0.0 < error[key] < error[(key[0], "vanilla", key[2])] - 0.05 < 1.0
    assert "| mul | 0.004 | mask | 2 | 0 |" in (out / "summary.md").read_text()
    config = json.loads((out / "config.json").read_text())
    assert config["config"]["open_value"] == 5.0 and config["config"]["qk_opt_steps"] == 11
    assert (out / "seq_acc.png").read_bytes()[:4] == b"\x89PNG"
    assert (out / "mask_mul.png").read_bytes()[:4] == b"\x89PNG"
    assert "add 0.004 mask step 10/10" in result.stderr
    assert_matches_golden(records, "arithmetic")  # the study skeleton's refactor changed no number


@pytest.mark.parametrize(
    "args, message",
    [
        (["--train-fractions=0.5,1.5"], "(0, 1)"),
        (["--train-fractions=0"], "(0, 1)"),
        (["--ops=div"], "unknown op 'div'"),
        (["--methods=nope"], "unknown method 'nope'"),
        (["--seeds=0"], "--seeds"),
        (["--set=model.width=3"], "model.width is not a field of ModelConfig"),
    ],
)
def test_arithmetic_bad_input_gives_one_clear_line(main, tmp_path, args, message):
    result = main("experiments.arithmetic", "--preset=test", f"--out={tmp_path / 'o'}", *args)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and lines[0].startswith("error:") and message in lines[0], (
        result.stderr
    )


def test_the_registry_is_the_one_allow_list():
    from maskjax.methods import methods_for

    for name in ("boolean", "arithmetic", "vision", "language"):
        assert {"vanilla", "mask", "mask_fixed", "mask_zero"} <= set(methods_for(name))
    assert "qk_svd" not in methods_for("vision") and "mask_random" not in methods_for("arithmetic")
    assert {"alibi", "alibi_matched", "qk_svd", "qk_opt", "mimetic"} <= set(methods_for("language"))
    assert "impulse" not in methods_for("language") and "alibi" not in methods_for("boolean")


@pytest.mark.parametrize("method", ["qk_svd", "qk_opt"])
def test_qk_position_scale_multiplies_the_position_embeddings_the_prior_is_built_on(method):
    task, config = ArithmeticTask("add"), study.STUDY.preset("test")
    key = jax.random.key(3)
    inits = {
        scale: study.make_group(
            study.ArithmeticGroup(task, 0.004, get_method(method)),
            [0],
            dataclasses.replace(config, qk_position_scale=scale),
        ).inputs.init_run(key)[0]
        for scale in (1.0, 5.0)
    }
    plain = study.make_group(study.ArithmeticGroup(task, 0.004, get_method("vanilla")), [0], config).inputs.init_run(
        key
    )[0]
    for scale, params in inits.items():
        np.testing.assert_allclose(params["pos_embed"], scale * plain["pos_embed"], rtol=1e-6)
    qkv = [np.asarray(params["block_0"]["attn"]["qkv"]["kernel"][:, :2]) for params in inits.values()]
    assert not np.allclose(*qkv)  # the prior is solved on the positions it will see
