"""What an embedding user installs: the drop-in imports without the studies' libraries, a study says in one
line which extra it needs, and the `maskjax` console script finds every program. (The built wheel itself is
checked in a fresh virtualenv by scripts/check_wheel.py, which .ci/run runs.)"""

import subprocess
import sys
import tomllib

import pytest
from conftest import ROOT

from maskjax import cli, extras

# Make these imports fail in a fresh interpreter, as they would where the extras are not installed.
BLOCK = "import sys; [sys.modules.__setitem__(m, None) for m in ('matplotlib', 'scipy', 'tokenizers', 'PIL', 'chex')]; "


def python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", BLOCK + code], cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_the_drop_in_runs_without_the_studies_libraries():
    done = python(
        "import jax.numpy as jnp, maskjax; q = jnp.ones((1, 4, 2, 8)); "
        "print(maskjax.masked_attention(q, q, q, jnp.zeros((2, 4, 4)), causal=True).shape)"
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "(1, 4, 2, 8)"


def test_a_study_without_its_extra_says_which_extra_in_one_line():
    done = python("import maskjax.studies.boolean")
    assert done.returncode != 0
    assert (
        done.stderr.strip()
        .splitlines()[-1]
        .endswith('maskjax.studies needs matplotlib, scipy, pillow, tokenizers: pip install "maskjax[studies]"')
    )
    done = python("from maskjax import cli; raise SystemExit(cli.main(['boolean', '--seeds=1']))")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert (
        done.stderr
        == 'error: maskjax boolean needs matplotlib, scipy, pillow, tokenizers: pip install "maskjax[studies]"\n'
    )


def test_the_core_dependencies_are_the_four_and_the_studies_are_an_extra():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert [r.split(">=")[0] for r in project["dependencies"]] == ["jax", "flax", "optax", "numpy"]
    studies = project["optional-dependencies"]["studies"]
    assert sorted(r.split(">=")[0] for r in studies) == sorted(extras.STUDIES.values())
    assert "maskjax[studies]" in project["optional-dependencies"]["test"]
    assert project["scripts"]["maskjax"] == "maskjax.cli:main"


def test_the_console_script_lists_and_runs_every_program(capsys):
    assert cli.main([]) == 2 and "commands:" in capsys.readouterr().err
    assert cli.main(["nope"]) == 2 and "unknown command 'nope'" in capsys.readouterr().err
    for command in cli.COMMANDS:  # each name is a module with a main(argv)
        assert callable(__import__(f"maskjax.cli.{command}", fromlist=["main"]).main), command
    with pytest.raises(SystemExit) as done:
        cli.main(["summarize", "--help"])
    assert done.value.code == 0 and "summarize" in capsys.readouterr().out


def test_the_experiments_aliases_are_the_cli_modules():
    import maskjax.cli.audit
    import maskjax.cli.boolean
    import maskjax.cli.driver
    from experiments import audit, boolean
    from experiments import cli as driver

    assert audit is maskjax.cli.audit and boolean is maskjax.cli.boolean and driver is maskjax.cli.driver


def test_a_program_started_as_the_console_script_names_itself_so(monkeypatch):
    from maskjax.cli.driver import Parser

    assert Parser(prog="python -m experiments.boolean").prog == "python -m experiments.boolean"
    monkeypatch.setattr(sys, "argv", ["/venv/bin/maskjax", "boolean"])
    assert Parser(prog="python -m experiments.boolean").prog == "maskjax boolean"
