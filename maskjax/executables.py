"""Compiled programs kept on disk, so that a repeated call with the same program skips tracing and lowering.

JAX's persistent compilation cache (`maskjax.runtime`) skips XLA's compile, but finding its entry needs the
program traced and lowered first, which is most of a short CLI call's time (docs/performance.md, issue 48).
Here the compiled executable itself is stored, under a key computed without tracing: the package's source,
the library versions, the devices, the host CPU and XLA flags, JAX's settings, every value the function
closes over (arrays by content: a held-out set baked into a probe is part of the program; code outside this
package and its libraries by its bytecode, the names it reads and its classes' bodies), which arguments
it donates, and the arguments' shapes, dtypes and shardings. Whatever cannot be keyed so (an object this
module cannot read, a mesh context, an elided array in a pytree's static data) is jitted as usual; so is
every function while no folder is set (`use_folder`, which the CLIs call with their compile cache). An entry
that cannot be read is compiled again and replaced. Entries are unpickled: the folder is trusted as JAX's
own cache is.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import hashlib
import importlib.metadata
import os
import pickle
import platform
import types
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import jax
import numpy as np

from maskjax import files

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
        identity = fingerprint((fn, tuple(donate_argnums)))
    except Unfingerprintable:
        return jitted
    return _Stored(jitted, _folder, identity)


class _Stored:
    """A jitted function whose compiled programs, one per argument signature and JAX settings, come from disk
    when there; a call that cannot be keyed goes to the plain jitted function."""

    def __init__(self, jitted: Callable, folder: Path, identity: str):
        self.jitted, self.folder, self.identity = jitted, folder, identity
        self.compiled: dict[str, Any] = {}

    def __call__(self, *args: Any) -> Any:
        try:
            signature = "\n".join([jit_settings(), argument_signature(args)])
        except Unfingerprintable:
            return self.jitted(*args)
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
        lowered = self.jitted.lower(*args)
        compiled = _compile_afresh(lowered)
        if compiled is None:  # a JAX without what that needs: compile as usual and store nothing
            return lowered.compile()
        _store(compiled, path)
        return compiled


def _compile_afresh(lowered: Any) -> Any | None:
    """The program compiled anew by XLA: on a CPU an executable read back from JAX's persistent cache
    serialises without its kernels, and the copy fails when run ("Function ... not found", JAX 0.10). So
    JAX's cache is off for this compile (JAX decides once per process whether it is on: the decision is
    reset on the way in and out), and neither its in-memory compilations nor the lowering's own executable,
    either of which may be such a copy, is reused. A program stored here is thus compiled once more the
    first time. None where this JAX lacks the switches."""
    try:
        from jax._src import compilation_cache, config
        from jax._src.interpreters import pxla

        reset, clear = compilation_cache.reset_cache, pxla._cached_compilation.cache_clear
        cache_enabled = config.enable_compilation_cache
    except (ImportError, AttributeError):
        return None
    reset()
    clear()
    try:
        with cache_enabled(False):
            # Options given (none), the lowering does not hand back the executable it compiled before.
            return lowered.compile(compiler_options={})
    finally:
        reset()


def _load(path: Path) -> Any | None:
    """The stored program at `path`, or None where there is none or it cannot be read back."""
    from jax.experimental import serialize_executable

    try:
        payload, in_tree, out_tree, device_ids = pickle.loads(path.read_bytes())
        os.utime(path)  # read now: the last to be pruned
        by_id = {d.id: d for d in jax.devices()}
        devices = [by_id[i] for i in device_ids]
        return serialize_executable.deserialize_and_load(payload, in_tree, out_tree, execution_devices=devices)
    except Exception:  # none, torn, stale or foreign: a miss, which the caller compiles and replaces
        return None


def _store(compiled: Any, path: Path) -> None:
    """Write the compiled program atomically; one that cannot be serialised or written is not kept (it is a
    cache: the call goes on with the program in memory)."""
    from jax.experimental import serialize_executable

    try:
        if "custom-call" in compiled.as_text():
            # A library kernel (LAPACK's SVD, a host callback) is registered with XLA by the process that
            # traces it; a process that reads the program back without tracing may not have it (jaxlib 0.10
            # crashes running one), so such programs are traced every time.
            return
        payload, in_tree, out_tree = serialize_executable.serialize(compiled)
        devices = compiled._executable.xla_executable.local_devices()
        blob = pickle.dumps((payload, in_tree, out_tree, [d.id for d in devices]))
    except Exception:
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        files.write_bytes(path, blob)
    except OSError:
        return
    _prune(path.parent, keep=path)


# Every change of the package's source keys new entries, so the folder is kept to this size: the entries
# read or written longest ago go first.
MAX_BYTES = 2 * 1024**3


def _prune(folder: Path, keep: Path) -> None:
    """Delete the entries used longest ago until the folder is within MAX_BYTES, all but `keep`."""
    try:
        entries = [(stat.st_mtime, stat.st_size, e) for e in folder.glob("*.executable") for stat in [e.stat()]]
    except OSError:
        return
    total = sum(size for _, size, _ in entries)
    for _, size, entry in sorted(entries, key=lambda item: item[0]):
        if total <= MAX_BYTES:
            return
        if entry == keep:
            continue
        try:
            entry.unlink(missing_ok=True)
        except OSError:
            return
        total -= size


def argument_signature(args: tuple) -> str:
    """The tree structure and, per leaf, shape, dtype, weak type and sharding (its devices by id): what a
    compiled program fixes. A tree whose static data prints elided (a large array) cannot be keyed."""
    leaves, treedef = jax.tree.flatten(args)
    structure = str(treedef)
    if "..." in structure:
        raise Unfingerprintable("a pytree's static data prints elided")
    parts = [structure]
    for leaf in leaves:
        aval = jax.typeof(leaf)
        sharding = getattr(leaf, "sharding", None)
        devices = getattr(sharding, "_device_assignment", None)
        device_ids = [d.id for d in devices] if devices is not None else None
        parts.append(f"{aval.str_short()}|{getattr(aval, 'weak_type', False)}|{sharding}|{device_ids}")
    return "\n".join(parts)


def fingerprint(value: Any) -> str:
    """A digest of a value's content: code by its module and name (the package's source and the libraries'
    versions are in `environment_digest`), with the values a function closes over and its defaults."""
    digest = hashlib.sha256()
    _feed(digest, value, {}, 0)
    return digest.hexdigest()


_MAX_DEPTH = 64
_LEAVES = (type(None), bool, int, float, complex, str, bytes, type(Ellipsis), np.dtype)
_BUILTIN_CONTAINERS = (tuple, list, set, frozenset, dict)


def _feed(digest: Any, value: Any, seen: dict[int, Any], depth: int) -> None:
    """seen holds every object fed so far, by id, and keeps it alive: an id is not reused while it is here."""
    if depth > _MAX_DEPTH:
        raise Unfingerprintable("nested too deeply")
    put = digest.update
    if type(value) is object:  # a library's sentinel (a default meaning "not given")
        put(b"sentinel;")
        return
    if isinstance(value, _LEAVES) or isinstance(value, enum.Enum):
        if type(value) not in _LEAVES:  # a subclass (an enum): its class says what it does
            _feed_type(digest, type(value), functools.partial(_feed, digest, seen=seen, depth=depth + 1))
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
    seen[id(value)] = value
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
        _feed_function(digest, value, deeper)
        return
    if isinstance(value, types.CodeType):
        _feed_code(digest, value, deeper)
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
    if isinstance(value, (jax.custom_vjp, jax.custom_jvp)):
        put(f"{type(value).__name__};".encode())
        for name in ("fun", "fwd", "bwd", "jvp", "nondiff_argnums", "symbolic_zeros", "optimize_remat"):
            put(f"{name}=".encode())
            deeper(getattr(value, name, None))
        return
    if not isinstance(value, _BUILTIN_CONTAINERS):
        _feed_type(digest, type(value), deeper)  # a NamedTuple's or a Mapping's own methods
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
        put(b"dataclass(")
        for field in dataclasses.fields(value):
            if field.name not in ("parent", "name"):
                put(f"{field.name}=".encode())
                deeper(getattr(value, field.name))
        put(b");")
        return
    raise Unfingerprintable(f"cannot fingerprint a {type(value).__module__}.{type(value).__qualname__}")


def _feed_function(digest: Any, value: types.FunctionType, deeper: Callable) -> None:
    """Its code, defaults and closure; for code outside this package and its libraries also the module-level
    values it (or a function nested in it) reads by name."""
    digest.update(f"function:{value.__module__}.{value.__qualname__};".encode())
    _feed_code(digest, value.__code__, deeper)
    deeper(value.__defaults__)
    deeper(value.__kwdefaults__)
    for cell in value.__closure__ or ():
        try:
            contents = cell.cell_contents
        except ValueError:  # a cell not yet filled
            contents = None
        deeper(contents)
    if not _covered(value.__module__):
        for name in sorted(_names_read(value.__code__)):
            if name in value.__globals__:
                digest.update(f"global:{name}=".encode())
                deeper(value.__globals__[name])


def _feed_code(digest: Any, code: types.CodeType, deeper: Callable) -> None:
    """Bytecode, the names and constants it uses and, through the constants, the code nested in it."""
    digest.update(f"code:{code.co_qualname}:{code.co_firstlineno}:".encode())
    digest.update(code.co_code)
    digest.update(repr((code.co_names, code.co_varnames, code.co_freevars, code.co_cellvars)).encode())
    deeper(code.co_consts)


def _names_read(code: types.CodeType) -> set[str]:
    """The global (and attribute) names a code object and the code nested in it use."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _names_read(const)
    return names


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
                deeper(attribute.fget)
                deeper(attribute.fset)
            else:
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


LIBRARIES = ("jax", "jaxlib", "flax", "optax", "numpy", "chex", "ml_dtypes")
# Distributions whose versions also enter the key: JAX's device plugins.
PLUGIN_PREFIXES = ("jax-cuda", "jax_cuda", "jax-rocm", "jax_rocm", "libtpu", "jax-tpu", "jax_plugins")


@functools.cache
def environment_digest() -> str:
    """What else a compiled program depends on, fixed once JAX has started: the package's source, the
    libraries' and device plugins' versions, the devices, the host CPU (an executable compiled for one
    CPU's instructions may not run on another's, and a cache folder may be shared) and XLA_FLAGS."""
    parts = [source_digest()]
    for name in LIBRARIES:
        try:
            parts.append(f"{name}={importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            parts.append(f"{name}=none")
    plugins = {
        f"{d.metadata['Name']}={d.version}"
        for d in importlib.metadata.distributions()
        if (d.metadata["Name"] or "").lower().startswith(PLUGIN_PREFIXES)
    }
    parts.extend(sorted(plugins))
    parts.append(";".join(f"{d.id}:{d.platform}:{d.device_kind}" for d in jax.devices()))
    parts.append(f"{platform.machine()}:{_cpu_flags()}")
    parts.append(os.environ.get("XLA_FLAGS", ""))
    return "\n".join(parts)


def _cpu_flags() -> str:
    """The host CPU's model and instruction-set flags, where the system says (Linux); else the processor."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor()
    wanted = ("model name", "flags", "Features")
    return "|".join(next((line for line in lines if line.startswith(key)), "") for key in wanted)


def jit_settings() -> str:
    """JAX's settings that enter its own jit cache, as they stand now (a context such as `jax.enable_x64`
    changes them): plain values, and the tracing axis environment, which is empty at the top level. Any other
    active setting (a mesh context) cannot be keyed here."""
    try:
        from jax._src import config, core

        values = config.trace_context()
    except (ImportError, AttributeError):
        raise Unfingerprintable("this JAX does not say its jit settings") from None
    parts = []
    for value in values:
        if _plain(value):
            parts.append(repr(value))
        elif isinstance(value, core.AxisEnv) and not (
            value.axis_sizes or value.spmd_axis_names or value.explicit_mesh_axis_names
        ):
            parts.append("no axes")
        else:
            raise Unfingerprintable(f"an active JAX setting of type {type(value).__qualname__}")
    return ",".join(parts)


def _plain(value: Any) -> bool:
    """A value whose repr says all of it: a number, string, enum, or a tuple of those."""
    if isinstance(value, tuple):
        return all(_plain(v) for v in value)
    return isinstance(value, (*_LEAVES, enum.Enum))
