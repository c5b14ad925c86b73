"""How a process uses the machine, set once before JAX starts its backends: CPU devices, the compile cache
and a study's XLA CPU flags.

On a CPU, JAX sees one device that runs one program at a time over every core; our small models leave
most cores idle (docs/performance.md). Split into one XLA device per core, the runs axis of a sweep is
sharded over the cores (`maskjax.sharding.runs_mesh`), with the same floats. And every compiled program is
kept in JAX's persistent compilation cache, so a second call with the same shapes compiles nothing; the
training programs are also kept whole (`maskjax.executables`, in the cache's EXECUTABLES subfolder), so a
second call with the same program does not even trace it.

A study may declare the XLA CPU flags that make its step fastest (`Study.cpu_xla_flags`, chosen by
`benchmarks.xla_flags`); they are added to XLA_FLAGS, which XLA reads when the first program compiles, unless
the user's XLA_FLAGS already sets the same flag.

Environment variables (a CLI flag, where given, wins): MASKJAX_CPU_DEVICES (a count; 1 keeps one device),
MASKJAX_COMPILE_CACHE (a folder, or "off") and MASKJAX_XLA_FLAGS ("study", the default, or "off").
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import jax

from maskjax import executables
from maskjax.errors import ConfigError

# Measured on the 2-core CI kind only (docs/performance.md); beyond 8 cores one device per core is untested.
MAX_DEFAULT_CPU_DEVICES = 8
OFF = "off"
STUDY = "study"
EXECUTABLES = "executables"


def default_cpu_devices() -> int:
    """One CPU device per core this process may run on, at most MAX_DEFAULT_CPU_DEVICES."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(cores, MAX_DEFAULT_CPU_DEVICES))


def default_cache_dir() -> Path:
    """The user's cache folder for maskjax, as XDG says: $XDG_CACHE_HOME/maskjax/jax, else ~/.cache/maskjax/jax."""
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "maskjax" / "jax"


def backends_started() -> bool:
    from jax._src import xla_bridge

    return xla_bridge.backends_are_initialized()


def configure(
    cpu_devices: int | None = None,
    compile_cache: str | None = None,
    xla_flags: Sequence[str] = (),
    use_xla_flags: str | None = None,
) -> dict:
    """Set the CPU device count, the compile cache and the study's XLA flags for this process, unless JAX has
    started already (then nothing can change: a notebook or test that imported and used JAX keeps its settings).

    cpu_devices: None takes MASKJAX_CPU_DEVICES, else one per core; an XLA_FLAGS device count set by the
    user is left alone. compile_cache: a folder or "off"; None takes MASKJAX_COMPILE_CACHE, else a
    JAX_COMPILATION_CACHE_DIR the user set, else `default_cache_dir()`. xla_flags: the study's CPU flags,
    applied unless use_xla_flags (None takes MASKJAX_XLA_FLAGS) is "off" (`with_xla_flags`).
    Returns what it set, for the log."""
    if backends_started():
        return {}
    settings = {}
    use = use_xla_flags if use_xla_flags is not None else os.environ.get("MASKJAX_XLA_FLAGS", STUDY)
    if use not in (STUDY, OFF):
        raise ConfigError(f"XLA flags must be {STUDY!r} (the study's own) or {OFF!r}, got {use!r}")
    applied = with_xla_flags(xla_flags) if use == STUDY else []
    if applied:
        settings["xla_flags"] = " ".join(applied)
    devices = cpu_devices if cpu_devices is not None else _env_count("MASKJAX_CPU_DEVICES")
    if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
        devices = devices if devices is not None else default_cpu_devices()
        if devices < 1:
            raise ConfigError(f"CPU device count must be >= 1, got {devices}")
        jax.config.update("jax_num_cpu_devices", devices)
        settings["cpu_devices"] = devices
    cache = compile_cache if compile_cache is not None else os.environ.get("MASKJAX_COMPILE_CACHE")
    if cache is None and (os.environ.get("JAX_COMPILATION_CACHE_DIR") or jax.config.jax_compilation_cache_dir):
        return settings
    if cache != OFF:
        folder = Path(cache) if cache else default_cache_dir()
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            message = f"cannot use {folder} as the compile cache ({e.strerror}); name another, or 'off'"
            raise ConfigError(message) from None
        jax.config.update("jax_compilation_cache_dir", str(folder))
        # Every program, however quick to compile: a study compiles tens of sub-second ones per batch.
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
        executables.use_folder(folder / EXECUTABLES)
        settings["compile_cache"] = str(folder)
    return settings


def with_xla_flags(flags: Sequence[str]) -> list[str]:
    """Add each flag to XLA_FLAGS unless the user's XLA_FLAGS names the same flag; returns those added."""
    present = os.environ.get("XLA_FLAGS", "")
    named = {flag.split("=", 1)[0] for flag in present.split()}
    added = [flag for flag in flags if flag.split("=", 1)[0] not in named]
    if added:
        os.environ["XLA_FLAGS"] = " ".join([present, *added]).strip()
    return added


def _env_count(name: str) -> int | None:
    text = os.environ.get(name)
    if text is None or not text.strip():
        return None
    try:
        return int(text)
    except ValueError:
        raise ConfigError(f"{name} must be a whole number, got {text!r}") from None
