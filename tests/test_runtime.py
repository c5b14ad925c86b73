"""What every CLI sets before JAX starts: CPU devices over which the runs are sharded, and the compile cache."""

import json
import os
import subprocess
import sys

from conftest import ROOT, run_cli


def python(code: str, **env: str) -> subprocess.CompletedProcess:
    """`python -c code` in a fresh process, so JAX starts with the settings under test."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), **env}
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)


def test_configure_sets_the_cpu_devices_and_cache_before_jax_starts(tmp_path):
    code = (
        "import jax; from maskjax import runtime; "
        f"s = runtime.configure(3, {str(tmp_path / 'cache')!r}); "
        "assert s == {'cpu_devices': 3, 'compile_cache': " + repr(str(tmp_path / "cache")) + "}, s; "
        "assert jax.device_count() == 3; "
        "from maskjax import executables; "
        f"assert executables.folder() == runtime.Path({str(tmp_path / 'cache' / 'executables')!r}); "
        "jax.jit(lambda x: x + 1)(1.0).block_until_ready(); "
        "assert runtime.configure(1, 'off') == {} and jax.device_count() == 3; print('ok')"
    )
    result = python(code)
    assert result.returncode == 0 and "ok" in result.stdout, result.stderr
    assert any((tmp_path / "cache").iterdir())


def test_an_xla_flags_device_count_and_off_are_left_alone(tmp_path):
    code = (
        "import jax; from maskjax import executables, runtime; "
        "print(runtime.configure(None, 'off'), jax.device_count(), executables.folder())"
    )
    result = python(code, XLA_FLAGS="--xla_force_host_platform_device_count=5", MASKJAX_CPU_DEVICES="2")
    assert result.returncode == 0 and result.stdout.split() == ["{}", "5", "None"], result.stderr


def test_the_environment_sets_the_device_count():
    code = "import jax; from maskjax import runtime; runtime.configure(None, 'off'); print(jax.device_count())"
    result = python(code, MASKJAX_CPU_DEVICES="4")
    assert result.returncode == 0 and result.stdout.strip() == "4", result.stderr


def test_runs_on_cpu_devices_take_the_most_devices_that_split_them_evenly():
    code = (
        "from maskjax.sharding import runs_mesh; "
        "print([runs_mesh(n).size for n in (1, 2, 3, 4, 6, 8, 12, 16)], runs_mesh().size)"
    )
    result = python(code, XLA_FLAGS="--xla_force_host_platform_device_count=8")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[1, 2, 3, 4, 6, 8, 6, 8] 8"


def test_bad_runtime_input_is_one_line_and_exit_2(tmp_path, cli):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    for args, env, expected in (
        ([f"--compile-cache={blocker / 'cache'}"], {}, "compile cache"),
        (["--cpu-devices=0"], {}, "--cpu-devices"),
        ([], {"MASKJAX_CPU_DEVICES": "two"}, "MASKJAX_CPU_DEVICES"),
        ([], {"MASKJAX_XLA_FLAGS": "fast"}, "XLA flags must be"),
        (["--xla-flags=fast"], {}, "--xla-flags"),
    ):
        result = cli("experiments.boolean", "--preset=test", "--seeds=1", f"--out={tmp_path / 'out'}", *args, env=env)
        lines = result.stderr.strip().splitlines()
        assert result.returncode == 2 and len(lines) == 1 and expected in lines[0], result.stderr
    assert not (tmp_path / "out").exists()


def test_a_repeated_cli_call_compiles_nothing_new(tmp_path):
    cache = tmp_path / "cache"
    args = ["--preset=test", "--seeds=2", "--methods=mask", f"--compile-cache={cache}"]
    first = run_cli("experiments.boolean", *args, f"--out={tmp_path / 'first'}")
    assert first.returncode == 0, first.stderr
    entries = sorted(p.name for p in cache.iterdir())
    stored = sorted(p.name for p in (cache / "executables").iterdir())
    second = run_cli("experiments.boolean", *args, f"--out={tmp_path / 'second'}")
    assert second.returncode == 0, second.stderr
    assert entries and sorted(p.name for p in cache.iterdir()) == entries
    # The training and scoring programs, read back whole (`maskjax.executables`): the same floats below.
    assert stored and sorted(p.name for p in (cache / "executables").iterdir()) == stored
    strip = ("git_commit", "batch_seconds", "devices")
    read = [(tmp_path / name / "results.jsonl").read_text().splitlines() for name in ("first", "second")]
    assert len(read[0]) == len(read[1]) == 2
    for a, b in zip(*read, strict=True):
        a, b = json.loads(a), json.loads(b)
        assert {k: v for k, v in a.items() if k not in strip} == {k: v for k, v in b.items() if k not in strip}


def test_a_studys_xla_flags_are_added_unless_the_user_sets_them_or_turns_them_off():
    """Issue 48: the flags reach XLA_FLAGS before the first compile (XLA reads them then: a bad flag would
    abort the compile, so the jit proves they were read), the user's own value of a flag wins, off adds none."""
    flags = ("--xla_cpu_use_onednn=false", "--xla_cpu_experimental_ynn_fusion_type=dot")
    code = (
        "import os, jax; from maskjax import runtime, store; "
        f"s = runtime.configure(None, 'off', {flags!r}); "
        "jax.jit(lambda x: x + 1)(1.0).block_until_ready(); "
        "print(repr(s.get('xla_flags'))); print(repr(store.environment()['xla_flags']))"
    )
    added = python(code, XLA_FLAGS="--xla_cpu_experimental_ynn_fusion_type=individual_dot")
    assert added.returncode == 0, added.stderr
    assert added.stdout.splitlines() == [
        "'--xla_cpu_use_onednn=false'",
        "'--xla_cpu_experimental_ynn_fusion_type=individual_dot --xla_cpu_use_onednn=false'",
    ]
    off = python(code, XLA_FLAGS="", MASKJAX_XLA_FLAGS="off")
    assert off.returncode == 0 and off.stdout.splitlines() == ["None", "''"], off.stderr


def test_the_cli_applies_the_studys_flags_and_its_records_name_them(tmp_path):
    code = (
        "import sys; from maskjax.study import get_study; from maskjax.cli.driver import main, run_main; "
        "study = get_study('boolean'); type(study).cpu_xla_flags = {'test': ('--xla_cpu_use_onednn=false',)}; "
        f"sys.exit(run_main(lambda argv: main(study, ['--preset=test', '--seeds=1', '--methods=mask', "
        f"'--compile-cache=off', '--out={tmp_path / 'out'}'])))"
    )
    result = python(code, XLA_FLAGS="")
    assert result.returncode == 0, result.stderr
    record = json.loads((tmp_path / "out" / "results.jsonl").read_text().splitlines()[0])
    assert record["xla_flags"] == "--xla_cpu_use_onednn=false"
