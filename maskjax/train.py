"""One training loop for every experiment.

`init_run` and `loss` describe ONE run; `train` stacks runs along a leading axis with
`jax.vmap`, compiles once with `jax.jit` (kept on disk by `maskjax.executables` when the CLI's compile
cache is on), and runs steps in `lax.fori_loop` chunks. Each run draws
its batches on device from its own data key and the step number, so a run is deterministic and
its result does not depend on which other runs share its group. The optimizer is `maskjax.optim`'s; the
runs axis is laid on devices by `maskjax.sharding`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

import jax
import jax.numpy as jnp
import numpy as np
import optax

from maskjax import executables
from maskjax.errors import ConfigError
from maskjax.optim import TrainConfig, make_optimizer
from maskjax.sharding import replicate, runs_mesh, shard_runs, to_host

PyTree = Any


class RunState(NamedTuple):
    """The state of one run; `train` holds these stacked along a leading runs axis."""

    params: PyTree
    constants: PyTree
    opt_state: PyTree
    data_key: jax.Array


def variables_of(params: PyTree, constants: PyTree) -> dict:
    """A run's Flax variables from its params and (possibly empty) constants."""
    return {"params": params, "constants": constants} if constants else {"params": params}


def epoch_orders(data_key: jax.Array, first_epoch: jax.Array, n_epochs: int, n_train: int) -> jax.Array:
    """The shuffled example order of epochs first_epoch .. first_epoch + n_epochs - 1: [n_epochs, n_train].

    A permutation costs a sort, so it is drawn once per epoch, not once per step.
    """
    epochs = first_epoch + jnp.arange(n_epochs)
    return jax.vmap(lambda e: jax.random.permutation(jax.random.fold_in(data_key, e), n_train))(epochs)


InitRun = Callable[..., tuple[PyTree, PyTree]]
Loss = Callable[[PyTree, PyTree, PyTree], jax.Array]
Log = Callable[[str], None]
# augment(key, batch) -> batch, for one run inside the jitted step (e.g. random crops and flips).
Augment = Callable[[jax.Array, PyTree], PyTree]


class Program(NamedTuple):
    """The compiled pieces of a group: `init(keys, *inputs)` -> stacked RunState, and
    `chunk(state, data, start, n_steps)` -> (state, losses [runs, chunk_steps]), n_steps <= chunk_steps
    traced (losses past n_steps are 0).
    `step(state, data, step)` is one vmapped step, for cost analysis (it draws its own epoch order)."""

    init: Callable
    chunk: Callable
    step: Callable


def compile_program(
    init_run: InitRun,
    loss: Loss,
    n_train: int,
    config: TrainConfig,
    data_per_run: bool = False,
    augment: Augment | None = None,
) -> Program:
    """vmap the one-run functions over the runs axis and jit them; the state is donated to each chunk.

    data_per_run: the data carries the runs axis too (each run its own training set, all of size n_train).
    augment: applied to every batch with a key drawn from the run's data key and the step, so
    augmentation is per run, deterministic and resumable.
    """
    if n_train < config.batch_size:
        raise ConfigError(f"training set of {n_train} examples is smaller than batch size {config.batch_size}")
    optimizer = make_optimizer(config)
    steps_per_epoch = n_train // config.batch_size

    def init_one(key: jax.Array, *inputs: jax.Array) -> RunState:
        init_key, data_key = jax.random.split(key)
        params, constants = init_run(init_key, *inputs)
        return RunState(params, constants, optimizer.init(params), data_key)

    def step_one(state: RunState, step: jax.Array, order: jax.Array, data: PyTree) -> tuple[RunState, jax.Array]:
        offset = (step % steps_per_epoch) * config.batch_size
        idx = jax.lax.dynamic_slice(order, (offset,), (config.batch_size,))
        batch = jax.tree.map(lambda a: a[idx], data)
        if augment is not None:
            batch = augment(jax.random.fold_in(jax.random.fold_in(state.data_key, step), 1), batch)
        value, grads = jax.value_and_grad(loss)(state.params, state.constants, batch)
        updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
        return state._replace(params=optax.apply_updates(state.params, updates), opt_state=opt_state), value

    def chunk_one(state: RunState, data: PyTree, start: jax.Array, n_steps: jax.Array) -> tuple[RunState, jax.Array]:
        # n_steps is traced, so one compiled program serves every chunk, the last short one included;
        # the losses of steps past n_steps stay 0.
        first_epoch = start // steps_per_epoch
        orders = epoch_orders(state.data_key, first_epoch, config.chunk_steps // steps_per_epoch + 2, n_train)

        def body(t: jax.Array, carry: tuple[RunState, jax.Array]) -> tuple[RunState, jax.Array]:
            s, losses = carry
            s, value = step_one(s, t, orders[t // steps_per_epoch - first_epoch], data)
            return s, losses.at[t - start].set(value)

        losses = jnp.zeros(config.chunk_steps, jnp.float32)
        return jax.lax.fori_loop(start, start + n_steps, body, (state, losses))

    data_axis = 0 if data_per_run else None

    def single_step(state: RunState, data: PyTree, step: jax.Array) -> tuple[RunState, jax.Array]:
        order = epoch_orders(state.data_key, step // steps_per_epoch, 1, n_train)[0]
        return step_one(state, step, order, data)

    return Program(
        init=executables.jit(jax.vmap(init_one)),
        chunk=executables.jit(jax.vmap(chunk_one, in_axes=(0, data_axis, None, None)), donate_argnums=(0,)),
        step=jax.jit(jax.vmap(single_step, in_axes=(0, data_axis, None))),
    )


Probe = Callable[[RunState, RunState], dict[str, jax.Array]]


class TrainInputs(NamedTuple):
    """One group of runs, as `train` takes it. init_run(key, *inputs) -> (params, constants) for one run;
    loss(params, constants, batch) -> scalar. run_keys [runs] and every array of run_inputs carry the runs
    axis; data is shared by all runs, or with data_per_run carries the runs axis as well (each run its own
    training set). augment(key, batch) -> batch runs in the step; probe(initial, state) -> {name: array} for
    one run is measured at init and after every chunk (e.g. how far the attention has drifted)."""

    init_run: InitRun
    loss: Loss
    run_keys: jax.Array
    run_inputs: tuple[jax.Array, ...]
    data: PyTree
    train_config: TrainConfig
    data_per_run: bool = False
    augment: Augment | None = None
    probe: Probe | None = None

    @property
    def n_train(self) -> int:
        return jax.tree.leaves(self.data)[0].shape[1 if self.data_per_run else 0]

    def program(self) -> Program:
        return compile_program(
            self.init_run, self.loss, self.n_train, self.train_config, self.data_per_run, self.augment
        )

    def laid_out(self, mesh: jax.sharding.Mesh) -> PyTree:
        """The data on the runs mesh: sharded with the runs when each has its own, else replicated."""
        return shard_runs(self.data, mesh) if self.data_per_run else replicate(self.data, mesh)


class Checkpointer(Protocol):
    """What `train` asks of a checkpointer (maskjax.checkpoint.SweepCheckpoints is one): whether a chunk end
    is due a save, save the state and history, and restore the newest readable (step, state, history)."""

    def due(self, done: int, previous: int) -> bool: ...

    def save(self, step: int, state: PyTree, history: dict[str, np.ndarray]) -> None: ...

    def restore_latest(self, like: PyTree, log: Log | None = None) -> tuple[int, PyTree, dict] | None: ...


class Trained(NamedTuple):
    """What `train` returns, runs first: initial and final states, losses [runs, steps] and, per probe
    name, its values at init and after every chunk [runs, chunks + 1, ...], with the steps they were taken at;
    resumed_at_step is the checkpoint's step this process trained on from (0 when it trained from the start),
    so a reader knows what its wall clock covers."""

    initial: RunState
    final: RunState
    losses: np.ndarray
    probes: dict[str, np.ndarray]
    probe_steps: list[int]
    resumed_at_step: int


def train(
    inputs: TrainInputs,
    log: Log | None = None,
    label: str = "",
    checkpoints: Checkpointer | None = None,
    resume: bool = False,
) -> Trained:
    """Train every run of a group (`TrainInputs`). checkpoints saves the group at chunk ends when due; with
    resume, training continues from its newest readable checkpoint. Checkpoints fall on chunk boundaries,
    so a resumed group runs the same chunks as an uninterrupted one: the same floats.
    """
    program, config = inputs.program(), inputs.train_config
    n_runs = len(inputs.run_keys)
    mesh = runs_mesh(n_runs)
    data = inputs.laid_out(mesh)
    measure = executables.jit(jax.vmap(inputs.probe)) if inputs.probe is not None else None

    def runs(tree: PyTree) -> PyTree:
        """The real runs, without the padding `shard_runs` added for this mesh."""
        return jax.tree.map(lambda a: a[:n_runs], tree)

    say = log if log is not None else (lambda message: None)
    clock = time.time()
    say(f"{label} compiling and initialising {n_runs} runs on {mesh.size} device(s)")
    initial = init_runs(program, inputs.run_keys, inputs.run_inputs, mesh)
    state, first_step = jax.tree.map(jnp.copy, initial), 0
    history: dict[str, list[np.ndarray]] = {"loss": []}
    if measure is not None:
        history.update({name: [to_host(v)[:n_runs, None]] for name, v in measure(initial, initial).items()})
    if checkpoints is not None and resume:
        # Checkpoints hold the real runs only, so a group resumes on any number of devices.
        found = checkpoints.restore_latest(runs(initial), log)
        if found is not None:
            first_step, restored, done = found
            state = shard_runs(restored, mesh)
            history = {name: [done[name]] for name in history}
            say(f"{label} resumed at step {first_step}/{config.steps}")
    say(f"{label} initialised in {time.time() - clock:.1f}s; training steps {first_step}..{config.steps}")
    started = time.time()
    for start in range(first_step, config.steps, config.chunk_steps):
        n_steps = min(config.chunk_steps, config.steps - start)
        state, chunk_losses = program.chunk(state, data, jnp.asarray(start), jnp.asarray(n_steps))
        history["loss"].append(to_host(chunk_losses)[:n_runs, :n_steps])
        if measure is not None:
            for name, value in measure(initial, state).items():
                history[name].append(to_host(value)[:n_runs, None])
        done = start + n_steps
        elapsed = time.time() - started
        rate = (done - first_step) / max(elapsed, 1e-9)
        say(
            f"{label} step {done}/{config.steps} loss {np.mean(history['loss'][-1][:, -1]):.4g} "
            f"({elapsed:.0f}s, {rate:.3g} steps/s, ETA {(config.steps - done) / rate:.0f}s)"
        )
        if checkpoints is not None and done < config.steps and checkpoints.due(done, start):
            checkpoints.save(done, runs(state), {name: np.concatenate(v, axis=1) for name, v in history.items()})
            say(f"{label} checkpoint saved at step {done}")
    joined = {name: np.concatenate(v, axis=1) if v else np.zeros((n_runs, 0)) for name, v in history.items()}
    initial, state = runs((initial, state))
    probe_steps = [0, *range(config.chunk_steps, config.steps, config.chunk_steps), config.steps]
    return Trained(initial, state, joined.pop("loss"), joined, probe_steps if measure is not None else [], first_step)


def init_runs(
    program: Program, run_keys: jax.Array, run_inputs: tuple, mesh: jax.sharding.Mesh | None = None
) -> RunState:
    """The runs' stacked initial state, every leaf sharded over the mesh (default `runs_mesh` for these runs).
    Leaves that do not depend on the run (a LayerNorm's ones) come out of init replicated; left so, the chunk
    program would compile once for them and again for the sharded state its first call returns."""
    mesh = mesh if mesh is not None else runs_mesh(len(run_keys))
    inputs = (run_keys, *run_inputs)
    if mesh.size > 1 and jax.process_count() == 1 and mesh.devices.flat[0].platform == "cpu":
        # jaxlib's CPU LAPACK kernels (the QK priors' SVD) fan a batch out over the host's shared pool of
        # one thread per core and block until it is done; one init program per CPU device blocks every
        # thread of that pool, and init never returns (jaxlib 0.10). So CPU meshes initialise on one device.
        return shard_runs(program.init(*jax.device_put(inputs, mesh.devices.flat[0])), mesh)
    return shard_runs(program.init(*shard_runs(inputs, mesh)), mesh)


def first_nonfinite_step(history: np.ndarray) -> np.ndarray:
    """Per run, the 1-based step whose loss first became NaN or infinite; 0 where none did."""
    bad = ~np.isfinite(history)
    return np.where(bad.any(axis=1), bad.argmax(axis=1) + 1, 0)
