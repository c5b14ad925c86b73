"""Compiled programs kept on disk (`maskjax.executables`): found again only for the same program, read back
right, and never at the cost of a wrong or failed call."""

import functools
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import ROOT

from maskjax import executables
from maskjax.optim import make_optimizer
from maskjax.study import Plan, get_study


def scaled(scale, x):
    return x * scale


def test_a_fingerprint_follows_content_not_identity():
    a = functools.partial(scaled, np.arange(3.0))
    assert executables.fingerprint(a) == executables.fingerprint(functools.partial(scaled, np.arange(3.0)))
    assert executables.fingerprint(a) != executables.fingerprint(functools.partial(scaled, np.arange(3.0) + 1e-7))
    assert executables.fingerprint(a) != executables.fingerprint(
        functools.partial(scaled, np.arange(3.0, dtype=np.float32))
    )

    def closure(value):
        return lambda x: x + value

    assert executables.fingerprint(closure(1.0)) == executables.fingerprint(closure(1.0))
    assert executables.fingerprint(closure(1.0)) != executables.fingerprint(closure(2.0))
    assert executables.fingerprint(closure(jnp.ones(2))) != executables.fingerprint(closure(jnp.zeros(2)))
    assert executables.fingerprint(lambda x: x + 1) != executables.fingerprint(lambda x: x - 1)
    keys = executables.fingerprint(jax.random.key(0)), executables.fingerprint(jax.random.key(1))
    assert keys[0] != keys[1]


HELPER_SCALE = 2.0


def scaled_by_helper():
    return jax.vmap(lambda x: x * HELPER_SCALE)


def test_a_fingerprint_reads_names_nested_globals_backward_rules_and_class_bodies(monkeypatch):
    on_one_line = [lambda x: jnp.sin(x), lambda x: jnp.cos(x)]
    assert executables.fingerprint(on_one_line[0]) != executables.fingerprint(on_one_line[1])

    before = executables.fingerprint(scaled_by_helper())
    monkeypatch.setattr(sys.modules[__name__], "HELPER_SCALE", 3.0)
    assert executables.fingerprint(scaled_by_helper()) != before

    def with_backward(backward):
        @jax.custom_vjp
        def f(x):
            return x

        f.defvjp(lambda x: (x, None), backward)
        return f

    assert executables.fingerprint(with_backward(lambda _, g: (g,))) != executables.fingerprint(
        with_backward(lambda _, g: (2 * g,))
    )

    def holder(offset):
        class Holder:
            @property
            def first(self):
                return 1

            @property
            def second(self):
                return offset

        return Holder

    assert executables.fingerprint(holder(1)) != executables.fingerprint(holder(2))
    with pytest.raises(executables.Unfingerprintable):
        executables.fingerprint(jax.jit(lambda x: x))


def test_what_cannot_be_fingerprinted_is_refused_and_then_jitted_as_usual(tmp_path, monkeypatch):
    class Opaque:
        pass

    holder = Opaque()

    def uses(x):
        return x + len(vars(holder))

    with pytest.raises(executables.Unfingerprintable, match="Opaque"):
        executables.fingerprint(uses)
    monkeypatch.setattr(executables, "_folder", tmp_path)
    assert not isinstance(executables.jit(uses), executables._Stored)
    assert float(executables.jit(uses)(1.0)) == 1.0
    assert not any(tmp_path.iterdir())


def test_a_stored_program_is_read_back_and_gives_the_same_floats(tmp_path, monkeypatch):
    monkeypatch.setattr(executables, "_folder", tmp_path)
    weights = np.random.default_rng(0).normal(size=(5, 5)).astype(np.float32)

    def step(state, x):
        return jnp.tanh(state @ weights + x), (state**2).sum()

    x = jnp.linspace(-1.0, 1.0, 5)
    expected = jax.jit(step)(jnp.eye(5), x)
    first = executables.jit(step, donate_argnums=(0,))
    assert isinstance(first, executables._Stored)
    got = first(jnp.eye(5), x)
    stored = sorted(tmp_path.iterdir())
    assert len(stored) == 1
    loads = []
    load = executables._load
    monkeypatch.setattr(executables, "_load", lambda path: loads.append(load(path)) or loads[-1])
    again = executables.jit(step, donate_argnums=(0,))(jnp.eye(5), x)
    assert loads and loads[0] is not None, "the second jit of the same function read the stored program"
    for a, b, c in zip(expected, got, again, strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
        np.testing.assert_array_equal(np.asarray(a), np.asarray(c))
    executables.jit(step)(jnp.eye(5)[:4, :], x)  # another shape: another program, stored beside
    assert len(list(tmp_path.iterdir())) == 2
    by_hand = first.lower(jnp.eye(5), x).compile()(jnp.eye(5), x)  # as benchmarks.step compiles
    np.testing.assert_array_equal(np.asarray(by_hand[0]), np.asarray(expected[0]))


def test_donation_and_jax_settings_are_part_of_the_key(tmp_path, monkeypatch):
    monkeypatch.setattr(executables, "_folder", tmp_path)

    def step(x):
        return x + 1

    kept = jnp.ones(3)
    executables.jit(step, donate_argnums=(0,))(jnp.ones(3))
    np.testing.assert_array_equal(np.asarray(executables.jit(step)(kept)), 2.0)
    np.testing.assert_array_equal(np.asarray(kept), 1.0)  # not donated: still readable
    assert len(list(tmp_path.iterdir())) == 2
    stored = executables.jit(step)
    narrow = stored(np.ones(3))
    with jax.enable_x64(True):
        wide, plain = stored(np.ones(3)), jax.jit(step)(np.ones(3))
    assert narrow.dtype == jnp.float32 and wide.dtype == plain.dtype == jnp.float64


def test_a_program_calling_a_library_kernel_is_not_stored(tmp_path, monkeypatch):
    """LAPACK's SVD (the QK priors' init) is a custom call that a process reading the program back without
    tracing may not have registered: jaxlib 0.10 crashed running one (vision's mimetic init)."""
    monkeypatch.setattr(executables, "_folder", tmp_path)
    matrix = np.random.default_rng(1).normal(size=(4, 4)).astype(np.float32)
    singular = executables.jit(lambda m: jnp.linalg.svd(m)[1])(matrix)
    np.testing.assert_allclose(np.asarray(singular), np.linalg.svd(matrix)[1], rtol=1e-5)
    assert not any(tmp_path.iterdir())


def test_the_folder_keeps_the_entries_used_last_within_its_size(tmp_path, monkeypatch):
    monkeypatch.setattr(executables, "_folder", tmp_path)
    old = tmp_path / "old.executable"
    old.write_bytes(b"x" * 100)
    os.utime(old, (1, 1))
    monkeypatch.setattr(executables, "MAX_BYTES", 100)

    def double(x):
        return 2 * x

    assert float(executables.jit(double)(1.0)) == 2.0
    assert not old.exists() and len(list(tmp_path.iterdir())) == 1


def test_an_unreadable_entry_is_compiled_again_and_replaced(tmp_path, monkeypatch):
    monkeypatch.setattr(executables, "_folder", tmp_path)

    def double(x):
        return 2 * x

    assert float(executables.jit(double)(3.0)) == 6.0
    (entry,) = tmp_path.iterdir()
    entry.write_bytes(b"torn")
    assert float(executables.jit(double)(3.0)) == 6.0
    assert entry.read_bytes() != b"torn" and len(list(tmp_path.iterdir())) == 1


def python(code: str, cache: str | None = None) -> subprocess.CompletedProcess:
    """`python -c code` in a fresh process; cache: JAX's compile cache folder (else the suite's)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), **({"JAX_COMPILATION_CACHE_DIR": cache} if cache else {})}
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)


def test_a_program_whose_compile_jax_had_cached_is_stored_whole(tmp_path):
    """On a CPU an executable read from JAX's own compile cache serialises without its kernels (JAX 0.10),
    JAX decides once per process whether its cache is on, and keeps its compilations in memory too. A
    program compiled (and cached by JAX) in one process, then stored in a second whose first jits already
    turned JAX's cache on and compiled that program, must run in a third."""

    def stored_in(folder: str) -> str:
        return textwrap.dedent(
            f"""
            import jax, jax.numpy as jnp, numpy as np
            from maskjax import executables
            jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
            jax.jit(lambda x: x + 1)(1.0).block_until_ready()
            def f(x):
                return jnp.stack([x[i : i + 3].sum() for i in range(5)]) * jnp.sin(x[:5])
            jax.jit(f)(jnp.arange(10.0)).block_until_ready()  # and the program itself, in memory
            executables.use_folder({str(tmp_path / folder)!r})
            print(np.asarray(executables.jit(f)(jnp.arange(10.0))).tolist())
            """
        )

    cache = str(tmp_path / "jax")
    first = python(stored_in("elsewhere"), cache)
    assert first.returncode == 0, first.stderr
    for _ in range(2):
        result = python(stored_in("stored"), cache)
        assert result.returncode == 0, result.stderr
        assert result.stdout == first.stdout
    assert len(list((tmp_path / "stored").iterdir())) == 1


def test_fingerprints_and_keys_are_the_same_in_every_process():
    code = textwrap.dedent(
        """
        import jax, jax.numpy as jnp
        from maskjax import executables
        offset = jnp.arange(4.0)
        print(executables.fingerprint(jax.vmap(lambda x: x + offset)))
        print(executables.environment_digest())
        """
    )
    outputs = {python(code).stdout for _ in range(2)}
    assert len(outputs) == 1 and next(iter(outputs)).strip()


@pytest.mark.parametrize("name", ["boolean", "arithmetic", "vision", "language"])
def test_every_studys_training_program_can_be_stored(name):
    """A closure holding what no fingerprint reads would silently turn storing off for a whole study."""
    study = get_study(name)
    config = study.preset("test")
    scope = study.benchmark_scope if study.benchmark_scope is not None else study.scope_type()
    methods = tuple(study.resolve_methods(study.default_methods, config, scope))
    plan = Plan(config, scope, methods, (0, 1), study.sample_data(config, scope), None)
    for group in study.groups(plan)[: len(methods)]:
        inputs = study.build(config, group.spec, [0, 1]).inputs
        parts = [inputs.init_run, inputs.loss, inputs.probe, inputs.augment, make_optimizer(inputs.train_config)]
        assert all(executables.fingerprint(part) for part in parts)
