"""Runs laid along one mesh axis, `runs`: the mesh, sharding a stacked tree over it (padded to fill it),
replicating shared data on it, and reading results back to the host, across processes when there are many."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils

PyTree = Any


def runs_mesh(n_runs: int | None = None) -> jax.sharding.Mesh:
    """A 1-D mesh named `runs`: over every device of every host, or, for n_runs on one host's CPU, over
    the most devices that split the runs evenly. CPU devices share the host's cores, so a run padded in
    to fill a device costs as much as a real one; elsewhere a padded run costs nothing."""
    devices = jax.devices()
    if n_runs is not None and jax.process_count() == 1 and devices[0].platform == "cpu":
        devices = devices[: max(d for d in range(1, len(devices) + 1) if n_runs % d == 0)]
    return jax.sharding.Mesh(np.asarray(devices), ("runs",))


def shard_runs(tree: PyTree, mesh: jax.sharding.Mesh | None = None) -> PyTree:
    """Pad the leading runs axis to a multiple of the mesh's size and shard it over the mesh
    (default `runs_mesh` for these runs).

    Padding repeats the last run; `train` drops the padded runs from what it returns.
    """
    n_runs = len(jax.tree.leaves(tree)[0])
    mesh = mesh if mesh is not None else runs_mesh(n_runs)
    pad = -n_runs % mesh.size

    sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("runs"))

    def pad_and_put(a: jax.Array) -> jax.Array:
        if pad:
            a = jnp.concatenate([a, jnp.repeat(a[-1:], pad, axis=0)])
        if jax.process_count() == 1:
            return jax.device_put(a, sharding)
        return global_array(a, sharding)

    return jax.tree.map(pad_and_put, tree)


def global_array(a: jax.Array | np.ndarray, sharding: jax.sharding.Sharding) -> jax.Array:
    """`a`, which every process holds whole, as one array laid out by `sharding` over every process's devices
    (each process places its own shards; device_put cannot reach another host's devices). Keys go as their data."""
    if jax.dtypes.issubdtype(getattr(a, "dtype", None), jax.dtypes.prng_key):
        return jax.random.wrap_key_data(global_array(jax.random.key_data(a), sharding), impl=jax.random.key_impl(a))
    host = to_host(a)
    return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])


def replicate(tree: PyTree, mesh: jax.sharding.Mesh | None = None) -> PyTree:
    """Every leaf as one global array replicated on every device of the mesh (default: every device), so data
    shared by all runs enters the sharded programs as a global array on every host (each process passes the
    same values)."""
    sharding = jax.sharding.NamedSharding(mesh if mesh is not None else runs_mesh(), jax.sharding.PartitionSpec())

    return jax.tree.map(lambda leaf: global_array(leaf, sharding), tree)


def to_host(x: jax.Array) -> np.ndarray:
    """x as one numpy array on this host, gathered from every process when its runs span hosts."""
    if getattr(x, "is_fully_addressable", True):
        return np.asarray(x)
    return np.asarray(multihost_utils.process_allgather(x, tiled=True))
