import argparse

import jax.numpy as jnp
import pytest

from maskjax import store
from maskjax.cli.driver import UserError, run_main, seed_list
from maskjax.errors import ConfigError


@pytest.mark.parametrize("text, seeds", [("3", [0, 1, 2]), ("5,2,9", [5, 2, 9]), ("8:11", [8, 9, 10])])
def test_seeds_take_a_count_a_list_or_a_range(text, seeds):
    assert seed_list(text) == seeds


@pytest.mark.parametrize("text", ["0", "-1", "4:4", "1,1", "a:b", "2,-3", ""])
def test_bad_seeds_are_refused(text):
    with pytest.raises(argparse.ArgumentTypeError):
        seed_list(text)


def test_only_bad_input_becomes_one_line_and_a_bug_keeps_its_traceback(capsys):
    def bad_input(argv):
        raise UserError("--seeds: expected a count")

    def bug(argv):
        raise ValueError("operands could not be broadcast together")

    assert run_main(bad_input, []) == 2
    assert capsys.readouterr().err == "error: --seeds: expected a count\n"
    with pytest.raises(ValueError, match="broadcast"):
        run_main(bug, [])
    with pytest.raises(OSError):
        run_main(lambda argv: open("/nonexistent/dir/file"), [])


def test_the_library_reports_bad_input_as_config_errors_a_caller_can_still_catch_as_builtins(tmp_path):
    from maskjax import masked_attention
    from maskjax.data import images

    with pytest.raises(FileNotFoundError) as missing:  # a caller's own `except FileNotFoundError` still works
        images.load_fashion_mnist(tmp_path / "nowhere")
    (tmp_path / "file").write_text("x")
    with pytest.raises(OSError) as unwritable:
        store.ensure_writable_dir(tmp_path / "file")
    with pytest.raises(ValueError) as shape:
        masked_attention(jnp.ones((1, 4, 2, 8)), jnp.ones((1, 4, 2, 8)), jnp.ones((1, 4, 2, 8)), jnp.zeros((3, 4, 4)))
    for raised in (missing, unwritable, shape):  # and the CLIs print each as one line, exit 2
        assert isinstance(raised.value, ConfigError)
        assert run_main(lambda argv, e=raised.value: (_ for _ in ()).throw(e), []) == 2


def test_a_torn_results_file_is_one_line_naming_file_and_line(cli, tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "results.jsonl").write_text('{"task": "2parity"}\n{"task": "2par')
    result = cli("experiments.summarize", str(tmp_path / "run"), f"--out={tmp_path / 's.md'}")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "results.jsonl:2 is not a JSON record" in result.stderr
