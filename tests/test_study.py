"""The Study interface and the one driver: flags from the config, the Python path equal to the CLI's."""

import dataclasses
import json

import pytest
from golden_check import assert_matches_golden

from maskjax import overrides
from maskjax.cli import driver as cli
from maskjax.errors import ConfigError
from maskjax.runner import RunControl, run
from maskjax.studies import arithmetic, boolean, vision
from maskjax.study import BUILT_IN, get_study

STUDIES = tuple(get_study(name) for name in BUILT_IN)


@pytest.mark.parametrize("study", STUDIES, ids=lambda s: s.name)
def test_every_config_field_is_a_flag_and_each_flag_sets_what_set_sets(study):
    parser = cli.study_parser(study)
    flags = {a.dest: a.option_strings for a in parser._actions}
    config = study.presets["test"]
    for field in overrides.fields_of(study.config_type):
        if field.path == ("preset",):
            continue
        assert f"config.{field.name}" in flags, field.name
    for common in ("--dim", "--dtype", "--optimizer", "--mask-weight-decay", "--batch-size", "--learning-rate"):
        assert any(common in options for options in flags.values()), (study.name, common)
    by_flag = cli.config_from_args(
        study, parser.parse_args(["--preset=test", "--dim=24", "--optimizer=sgd", "--mask-weight-decay=0"])
    )
    by_set = overrides.apply(config, ["model.dim=24", "optimizer=sgd", "mask_weight_decay=0"])
    assert by_flag == by_set and by_flag.model.dim == 24 and by_flag.mask_weight_decay == 0.0


@pytest.mark.parametrize(
    "flag, message",
    [
        ("--dim=0", "expected a positive integer, got '0'"),
        ("--weight-decay=-1", "expected a finite number >= 0, got '-1'"),
        ("--learning-rate=0", "expected a finite number > 0, got '0'"),
        ("--dtype=float16", "invalid choice"),
        ("--warmup-fraction=1", "expected a finite number >= 0 and < 1, got '1'"),
    ],
)
def test_a_generated_flag_refuses_what_its_field_refuses(flag, message):
    with pytest.raises(cli.UserError, match=message.replace("(", r"\(")):
        cli.study_parser(vision.STUDY).parse_args(["--preset=test", flag])


def test_set_and_a_config_built_in_python_meet_the_same_bounds():
    with pytest.raises(ConfigError, match="learning_rate expects a finite number > 0"):
        overrides.apply(vision.STUDY.presets["test"], ["learning_rate=-1"])
    bad = dataclasses.replace(vision.STUDY.presets["test"], weight_decay=-0.5)
    with pytest.raises(ConfigError, match="weight_decay expects a finite number >= 0"):
        overrides.check(bad)
    with pytest.raises(ConfigError, match=r"train_fractions expects a number in \(0, 1\)"):
        overrides.check(arithmetic.ArithmeticScope(train_fractions=(0.5, 1.0)))


def test_run_from_python_is_the_cli_path_and_writes_the_same_records(tmp_path):
    """maskjax.runner.run with the test preset gives the golden records of the Boolean CLI test."""
    out = tmp_path / "py"
    lines = []
    result = run(boolean.STUDY, "test", out, methods=["mask"], seeds=[0, 1], log=lines.append)
    assert_matches_golden(result.records, "boolean")
    written = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert written == result.records and "| 2parity | mask |" in result.table
    assert json.loads((out / "config.json").read_text())["scope"]["tasks"] == ["2parity"]
    assert any("group 1 of 1: 2parity_mask, 2 runs" in line for line in lines)
    with pytest.raises(ConfigError, match="already holds 2 results"):
        run(boolean.STUDY, "test", out, methods=["mask"], seeds=[0, 1], log=lines.append)
    again = run(boolean.STUDY, "test", out, methods=["mask"], seeds=[0, 1], control=RunControl(resume=True))
    assert again.records == result.records


@pytest.mark.parametrize("seeds", [[], [-1], [2, 2]])
def test_run_refuses_bad_seeds_before_anything_is_written(tmp_path, seeds):
    with pytest.raises(ConfigError, match="at least one seed"):
        run(boolean.STUDY, "test", tmp_path / "o", seeds=seeds)
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("study", STUDIES, ids=lambda s: s.name)
def test_every_preset_and_default_scope_meets_its_own_bounds(study):
    for config in study.presets.values():
        overrides.check(config)
    overrides.check(study.scope_type())
    assert study.default_preset in study.presets and "test" in study.presets
    assert set(study.cpu_xla_flags) <= set(study.presets)  # flags name presets that exist
    assert all(flag.startswith("--xla_cpu_") for flags in study.cpu_xla_flags.values() for flag in flags)


def test_the_registry_finds_every_built_in_study_and_refuses_an_unknown_or_second_one():
    from maskjax.study import Study, register

    assert [get_study(name).name for name in BUILT_IN] == list(BUILT_IN)
    assert get_study("boolean") is boolean.STUDY and register(boolean.STUDY) is boolean.STUDY
    with pytest.raises(ConfigError, match="unknown study 'nope'; known: boolean, arithmetic, vision, language"):
        get_study("nope")

    class Impostor(Study):
        name = "boolean"

    with pytest.raises(ConfigError, match="study 'boolean' is already registered"):
        register(Impostor())
