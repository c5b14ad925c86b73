"""Compiled programs kept on disk, so that a repeated call with the same program skips tracing and lowering.

JAX's persistent compilation cache (`maskjax.runtime`) skips XLA's compile, but finding its entry needs the
program traced and lowered first, which is most of a short CLI call's time (docs/performance.md, issue 48).
Here the compiled executable itself is stored, under a key computed without tracing: the package's source,
the library versions, the devices and XLA flags, every value the function closes over (arrays by content:
a held-out set baked into a probe is part of the program) and the arguments' shapes, dtypes and shardings.
A function holding something that cannot be fingerprinted (an open file, an unknown object) is jitted as
usual; so is every function while no folder is set (`use_folder`, which the CLIs call with their compile
cache). An entry that cannot be read is compiled again and replaced. Entries are unpickled: the folder is
trusted as JAX's own cache is.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import functools
import hashlib
import importlib.metadata
import os
import pickle
import tempfile
import types
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import jax
import numpy as np

_folder: Path | None = None


def use_folder(folder: Path | str | None) -> None:
    """Keep compiled programs in `folder` from now on (None: stop)."""
    global _folder
    _folder = Path(folder) if folder is not None else None


def folder() -> Path | None:
    return _folder


class Unfingerprintable(TypeError):
    """A value whose content cannot be told apart from another's by what this module reads."""


def jit(fn: Callable, donate_argnums: tuple[int, ...] = ()) -> Callable:
    """`jax.jit(fn)`, whose compiled programs are stored in and read from the folder set by `use_folder`
    when one is set, `fn`'s closure can be fingerprinted and the process is alone (no multi-host job)."""
    jitted = jax.jit(fn, donate_argnums=donate_argnums)
    if _folder is None or jax.process_count() > 1:
        return jitted
    try:
        identity = fingerprint(fn)
    except Unfingerprintable:
        return jitted
    return _Stored(jitted, _folder, identity)


class _Stored:
    """A jitted function whose compiled programs, one per argument signature, come from disk when there."""

    def __init__(self, jitted: Callable, folder: Path, identity: str):
        self.jitted, self.folder, self.identity = jitted, folder, identity
        self.compiled: dict[str, Any] = {}

    def __call__(self, *args: Any) -> Any:
        signature = argument_signature(args)
        compiled = self.compiled.get(signature)
        if compiled is None:
            compiled = self.compiled[signature] = self.load_or_compile(args, signature)
        return compiled(*args)

    def lower(self, *args: Any) -> Any:
        """As `jax.jit`'s, for a caller that compiles by hand (`benchmarks.step`); nothing is stored."""
        return self.jitted.lower(*args)

    def load_or_compile(self, args: tuple, signature: str) -> Any:
        key = hashlib.sha256("\n".join([environment_digest(), self.identity, signature]).encode()).hexdigest()
        path = self.folder / f"{key}.executable"
        loaded = _load(path)
        if loaded is not None:
            return loaded
        with _compile_afresh():
            compiled = self.jitted.lower(*args).compile()
        _store(compiled, path)
        return compiled


@contextlib.contextmanager
def _compile_afresh() -> Iterator[None]:
    """A context in which XLA compiles without JAX's persistent cache: on a CPU, an executable read back from
    that cache serialises without its kernels, and the copy fails when run ("Function ... not found",
    JAX 0.10). JAX decides once per process whether its cache is on, so the decision is reset on the way in
    and out. A program stored here is thus compiled once more the first time, by XLA itself."""
    from jax._src import compilation_cache, config

    compilation_cache.reset_cache()
    try:
        with config.enable_compilation_cache(False):
            yield
    finally:
        compilation_cache.reset_cache()


def _load(path: Path) -> Any | None:
    """The stored program at `path`, or None where there is none or it cannot be read back."""
    from jax.experimental import serialize_executable

    try:
        payload, in_tree, out_tree, device_ids = pickle.loads(path.read_bytes())
        by_id = {d.id: d for d in jax.devices()}
        devices = [by_id[i] for i in device_ids]
        return serialize_executable.deserialize_and_load(payload, in_tree, out_tree, execution_devices=devices)
    except Exception:  # none, torn, stale or foreign: a miss, which the caller compiles and replaces
        return None


def _store(compiled: Any, path: Path) -> None:
    """Write the compiled program atomically; a program JAX cannot serialise, or a full disk, is not kept."""
    from jax.experimental import serialize_executable

    try:
        payload, in_tree, out_tree = serialize_executable.serialize(compiled)
        devices = compiled._executable.xla_executable.local_devices()
        blob = pickle.dumps((payload, in_tree, out_tree, [d.id for d in devices]))
    except (ValueError, NotImplementedError, TypeError, AttributeError, pickle.PicklingError):
        return
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            f.write(blob)
        os.replace(tmp, path)
    except OSError:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)


def argument_signature(args: tuple) -> str:
    """The tree structure and, per leaf, shape, dtype, weak type and sharding: what a compiled program fixes."""
    leaves, treedef = jax.tree.flatten(args)
    parts = [str(treedef)]
    for leaf in leaves:
        aval = jax.typeof(leaf)
        sharding = getattr(leaf, "sharding", None)
        parts.append(f"{aval.str_short()}|{getattr(aval, 'weak_type', False)}|{sharding}")
    return "\n".join(parts)


def fingerprint(value: Any) -> str:
    """A digest of a value's content: code by its module and name (the package's source and the libraries'
    versions are in `environment_digest`), with the values a function closes over and its defaults."""
    digest = hashlib.sha256()
    _feed(digest, value, set(), 0)
    return digest.hexdigest()


_MAX_DEPTH = 64
_LEAVES = (type(None), bool, int, float, complex, str, bytes, type(Ellipsis), np.dtype)


def _feed(digest: Any, value: Any, seen: set[int], depth: int) -> None:
    if depth > _MAX_DEPTH:
        raise Unfingerprintable("nested too deeply")
    put = digest.update
    if type(value) is object:  # a library's sentinel (a default meaning "not given")
        put(b"sentinel;")
        return
    if isinstance(value, _LEAVES) or isinstance(value, enum.Enum):
        put(f"{type(value).__qualname__}:{value!r};".encode())
        return
    if isinstance(value, np.generic):
        value = np.asarray(value)
    if isinstance(value, jax.Array):
        if jax.dtypes.issubdtype(value.dtype, jax.dtypes.prng_key):
            put(f"key<{jax.random.key_impl(value)}>;".encode())
            value = jax.random.key_data(value)
        value = np.asarray(value)
    if isinstance(value, np.ndarray):
        put(f"array:{value.dtype.str}:{value.shape};".encode())
        put(np.ascontiguousarray(value).tobytes())
        return
    if id(value) in seen:  # a cycle, or the same object met again: its content is already in
        put(b"seen;")
        return
    seen.add(id(value))
    deeper = functools.partial(_feed, digest, seen=seen, depth=depth + 1)
    if isinstance(value, types.BuiltinFunctionType):
        put(f"builtin:{getattr(value, '__module__', '')}.{value.__name__};".encode())
        return
    if isinstance(value, types.ModuleType):
        put(f"module:{value.__name__};".encode())
        if not _covered(value.__name__):
            file = getattr(value, "__file__", None)
            if file is None:
                raise Unfingerprintable(f"module {value.__name__} has no source file")
            put(Path(file).read_bytes())
        return
    if isinstance(value, type):
        _feed_type(digest, value, deeper)
        return
    if isinstance(value, types.FunctionType):
        code = value.__code__
        put(f"function:{value.__module__}.{value.__qualname__}:{code.co_firstlineno};".encode())
        put(code.co_code)
        deeper(code.co_consts)
        deeper(value.__defaults__)
        deeper(value.__kwdefaults__)
        for cell in value.__closure__ or ():
            try:
                contents = cell.cell_contents
            except ValueError:  # a cell not yet filled
                contents = None
            deeper(contents)
        if not _covered(value.__module__):
            # The user's own code: the module-level values it reads are part of the program too.
            for name in code.co_names:
                if name in value.__globals__:
                    put(f"global:{name}=".encode())
                    deeper(value.__globals__[name])
        return
    if isinstance(value, types.CodeType):
        put(f"code:{value.co_qualname}:{value.co_firstlineno};".encode())
        put(value.co_code)
        deeper(value.co_consts)
        return
    if isinstance(value, types.MethodType):
        put(b"method;")
        deeper(value.__func__)
        deeper(value.__self__)
        return
    if isinstance(value, functools.partial):
        put(b"partial;")
        deeper(value.func)
        deeper(value.args)
        deeper(value.keywords)
        return
    if isinstance(value, (tuple, list)):
        put(f"{type(value).__qualname__}:{len(value)}(".encode())
        for item in value:
            deeper(item)
        put(b");")
        return
    if isinstance(value, (set, frozenset)):
        put(f"{type(value).__qualname__}:{len(value)}(".encode())
        for item in sorted(value, key=repr):
            deeper(item)
        put(b");")
        return
    if isinstance(value, Mapping):
        put(f"{type(value).__qualname__}:{len(value)}{{".encode())
        for k, v in value.items():
            deeper(k)
            deeper(v)
        put(b"};")
        return
    if dataclasses.is_dataclass(value):
        # A Flax module's `parent` and `name` say where it sits, not what it computes.
        put(b"dataclass:")
        _feed_type(digest, type(value), deeper)
        put(b"(")
        for field in dataclasses.fields(value):
            if field.name not in ("parent", "name"):
                put(f"{field.name}=".encode())
                deeper(getattr(value, field.name))
        put(b");")
        return
    wrapped = getattr(value, "__wrapped__", None)
    if callable(value) and wrapped is not None:
        put(f"wrapped:{type(value).__qualname__};".encode())
        deeper(wrapped)
        return
    raise Unfingerprintable(f"cannot fingerprint a {type(value).__module__}.{type(value).__qualname__}")


# Class attributes that are not the class's behaviour.
_CLASS_BOOKKEEPING = frozenset(
    {"__module__", "__qualname__", "__doc__", "__dict__", "__weakref__", "__annotations__", "__slots__"}
)


def _feed_type(digest: Any, cls: type, deeper: Callable) -> None:
    """A class by its name; one from outside this package and the libraries also by what its own body and its
    bases' define (a notebook's Flax module is code the source digest does not hold)."""
    digest.update(f"type:{cls.__module__}.{cls.__qualname__};".encode())
    if _covered(cls.__module__):
        return
    for base in cls.__mro__:
        if _covered(base.__module__) or base is object:
            digest.update(f"base:{base.__module__}.{base.__qualname__};".encode())
            continue
        for name, attribute in sorted(vars(base).items()):
            if name in _CLASS_BOOKKEEPING or name.startswith("__dataclass") or name.startswith("_abc"):
                continue
            digest.update(f"{base.__qualname__}.{name}=".encode())
            if isinstance(attribute, (staticmethod, classmethod)):
                attribute = attribute.__func__
            if isinstance(attribute, property):
                attribute = (attribute.fget, attribute.fset)
            deeper(attribute)


def _covered(module: str | None) -> bool:
    """Whether a module's code is in `environment_digest`: this package's source, or a versioned library."""
    top = (module or "").split(".")[0]
    return top == __name__.split(".")[0] or top in LIBRARIES


@functools.cache
def source_digest() -> str:
    """A digest of every Python file of this package: a stored program is traced from this code."""
    digest = hashlib.sha256()
    root = Path(__file__).resolve().parent
    for path in sorted(root.rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


LIBRARIES = ("jax", "jaxlib", "flax", "optax", "numpy", "chex")


@functools.cache
def environment_digest() -> str:
    """What else a compiled program depends on: the package's source, the libraries' versions, the devices,
    XLA_FLAGS and JAX's settings that enter its own compile key (all fixed once JAX has started)."""
    parts = [source_digest()]
    for name in LIBRARIES:
        try:
            parts.append(f"{name}={importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            parts.append(f"{name}=none")
    parts.append(";".join(f"{d.id}:{d.platform}:{d.device_kind}" for d in jax.devices()))
    parts.append(os.environ.get("XLA_FLAGS", ""))
    parts.append(repr(_jit_settings()))
    return "\n".join(parts)


def _jit_settings() -> tuple:
    """The plain values among the settings JAX keys its own jit cache on (not the tracing state's objects)."""
    try:
        from jax._src import config

        values = config.trace_context()
    except (ImportError, AttributeError):  # a JAX without it: the settings a program most often depends on
        values = (jax.config.jax_enable_x64, jax.config.jax_default_matmul_precision)
    return tuple(v for v in values if isinstance(v, (*_LEAVES, enum.Enum)))
