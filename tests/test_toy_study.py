"""A fifth study written here and nowhere else (issue 47): it runs through the CLI driver, `maskjax.runner.run`
and `benchmarks.step` with no edit to any other file, so adding a study is one module."""

import dataclasses
import json
from typing import NamedTuple

import jax.numpy as jnp
import numpy as np
import pytest

from maskjax import runs, tables
from maskjax.methods import Method, methods_for
from maskjax.models.gotu import GotuTransformer
from maskjax.models.layers import ModelConfig
from maskjax.optim import OptimizerConfig
from maskjax.overrides import option
from maskjax.runner import run
from maskjax.study import Group, Study, get_study, register, study_names
from maskjax.train import TrainInputs, variables_of


@dataclasses.dataclass(frozen=True, kw_only=True)
class ToyConfig(OptimizerConfig):
    preset: str
    model: ModelConfig
    steps: int = option(8, help="training steps")
    batch_size: int = option(8, help="points per step")
    learning_rate: float = option(1e-2, above=0, help="learning rate")


@dataclasses.dataclass(frozen=True)
class ToyScope:
    bits: int = option(4, minimum=2, help="bits per input; the target is the sum of the first two")


class ToyGroup(NamedTuple):
    points: np.ndarray
    method: Method


class ToyInputs(NamedTuple):
    inputs: TrainInputs
    model: GotuTransformer


class ToyStudy(Study):
    name = "toy"
    title = "Toy study"
    config_type = ToyConfig
    scope_type = ToyScope
    presets = {"test": ToyConfig(preset="test", model=ModelConfig(8, 1, 2, 4, 8), chunk_steps=4)}
    default_preset = "test"
    default_seeds = 2

    def make_data(self, config, scope, log):
        return np.array(np.meshgrid(*[[-1.0, 1.0]] * scope.bits)).reshape(scope.bits, -1).T.astype(np.float32)

    def groups(self, plan):
        return [Group({"bits": plan.scope.bits, "method": m.name}, ToyGroup(plan.data, m)) for m in plan.methods]

    def build(self, config, spec, seeds):
        points, method = spec
        tokens = points.shape[1] + 1
        pattern = np.eye(tokens, dtype=bool) | (np.arange(tokens) < 3)[None, :]
        mask = runs.initial_mask_logits(lambda kind, seed: pattern, method, 0, (5.0, -5.0))
        model = GotuTransformer(points.shape[1], config.model, method.mask_mode)
        masks = jnp.broadcast_to(jnp.asarray(mask), (len(seeds), tokens, tokens))
        heads = jnp.broadcast_to(jnp.asarray(pattern, jnp.float32), (config.model.heads, tokens, tokens))

        def init(mask_logits):
            return GotuTransformer(points.shape[1], config.model, method.mask_mode, mask_logits)

        init_run = runs.prior_init(init, method, jnp.asarray(points[:1]), heads, heads, config.qk_opt_steps)
        target = points[:, 0] + points[:, 1]

        def loss(params, constants, batch):
            return jnp.mean((model.apply(variables_of(params, constants), batch[0]) - batch[1]) ** 2)

        train_config = config.optimizer_config(config.steps, config.batch_size, config.learning_rate)
        data = (jnp.asarray(points), jnp.asarray(target))
        return ToyInputs(TrainInputs(init_run, loss, runs.seed_keys(seeds), (masks,), data, train_config), model)

    def record(self, config, spec, seeds, built, trained, started):
        points, method = spec

        def squared_error(variables, chunk, filler):
            x, y = chunk
            return ((built.model.apply(variables, x) - y) ** 2).sum()

        target = points[:, 0] + points[:, 1]
        sse = runs.evaluate_runs(squared_error, trained.final, [points, target], eval_batch=5)
        outcomes = runs.outcome_fields(trained, built.inputs.train_config, 0.0)
        fields = {"bits": points.shape[1], "method": method.name}
        mse = sse / len(points)
        return [{**fields, "seed": s, "mse": float(mse[i]), **outcomes[i]} for i, s in enumerate(seeds)], {}

    def summary(self, plan, records, reference):
        table = tables.summary_table(records, ("mse", "train_loss"), ("bits", "method"))
        return table, table


TOY = register(ToyStudy())


def test_the_toy_study_is_found_by_name_with_the_generic_methods():
    assert get_study("toy") is TOY and "toy" in study_names()
    assert {"vanilla", "mask", "mask_fixed"} <= set(methods_for("toy")) and "alibi" not in methods_for("toy")


def test_the_toy_study_runs_from_the_cli_and_from_python_alike(tmp_path, capsys):
    from experiments import cli

    assert cli.main(TOY, ["--seeds=2", "--methods=vanilla,mask", "--bits=3", f"--out={tmp_path / 'cli'}"]) == 0
    assert "| 3 | mask |" in capsys.readouterr().out
    written = [json.loads(line) for line in (tmp_path / "cli" / "results.jsonl").read_text().splitlines()]
    config = json.loads((tmp_path / "cli" / "config.json").read_text())
    assert config["study"] == "toy" and config["scope"] == {"bits": 3} and config["config"]["steps"] == 8
    result = run(TOY, "test", tmp_path / "py", scope=ToyScope(bits=3), methods=["vanilla", "mask"], seeds=[0, 1])
    volatile = {"batch_seconds", "git_commit"}
    assert [{k: v for k, v in r.items() if k not in volatile} for r in result.records] == [
        {k: v for k, v in r.items() if k not in volatile} for r in written
    ]
    assert len(written) == 4 and written[0]["mse"] != written[2]["mse"] and all(np.isfinite(r["mse"]) for r in written)
    assert cli.run_main(lambda argv: cli.main(TOY, argv), ["--methods=alibi", f"--out={tmp_path / 'x'}"]) == 2


@pytest.mark.parametrize("method", ["vanilla", "mask"])
def test_benchmarks_step_times_the_toy_study(capsys, method):
    from benchmarks import step

    argv = ["--study=toy", "--preset=test", f"--method={method}", "--seeds=1,2", "--steps=2", "--repeats=1"]
    assert step.main([*argv, "--json-only"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["study"] == "toy" and [row["seeds"] for row in result["rows"]] == [1, 2]
    assert all(np.isfinite(row["step_seconds"]) and row["flops_per_step"] > 0 for row in result["rows"])
    assert "torch" not in result
