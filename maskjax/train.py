"""One training loop for every experiment.

`init_run` and `loss` describe ONE run; `train` stacks runs along a leading axis with
`jax.vmap`, compiles once with `jax.jit`, and runs steps in `lax.fori_loop` chunks. Each run draws
its batches on device from its own data key and the step number, so a run is deterministic and
its result does not depend on which other runs share its batch.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.experimental import multihost_utils

from maskjax.errors import ConfigError
from maskjax.overrides import option

PyTree = Any


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """optimizer: "adam" (Adam with L2 decay added to the gradient, the paper's and torch's
    Adam(weight_decay)), "adamw" (decoupled decay) or "sgd" (momentum 0.9, L2 added to the gradient as
    torch's SGD(weight_decay)); schedule: "constant" or "cosine" (decay to 0 over `steps`, after a linear
    warmup from 0 over `warmup_steps`). clip_norm clips the gradient's global norm first when set.
    mask_weight_decay: the decay of every parameter named `mask_logits`; None decays them like the rest."""

    steps: int
    batch_size: int = 256
    learning_rate: float = 1e-5
    weight_decay: float = 1e-3
    chunk_steps: int = 200
    optimizer: str = "adam"
    schedule: str = "constant"
    mask_weight_decay: float | None = None
    warmup_steps: int = 0
    clip_norm: float | None = None


OPTIMIZERS = ("adam", "adamw", "sgd")


def optimizer_option(default: str) -> Any:
    """A study config's optimizer field (the same flag and help in every study)."""
    return option(
        default,
        choices=OPTIMIZERS,
        help="adam: Adam with L2 decay added to the gradient (the paper's Boolean runs); adamw: decoupled decay; "
        "sgd: momentum 0.9 with L2 decay (give it its own learning rate)",
    )


def cosine_train_config(config: Any, steps: int, batch_size: int, **options: Any) -> TrainConfig:
    """The TrainConfig of a study config whose fields name its optimizer (learning_rate, weight_decay,
    chunk_steps, optimizer, mask_weight_decay), with cosine decay; options: warmup_steps, clip_norm."""
    return TrainConfig(
        steps,
        batch_size,
        config.learning_rate,
        config.weight_decay,
        config.chunk_steps,
        optimizer=config.optimizer,
        schedule="cosine",
        mask_weight_decay=config.mask_weight_decay,
        **options,
    )


def mask_decay_option() -> Any:
    """A study config's mask_weight_decay field."""
    return option(
        None, minimum=0, help="weight decay of the mask logits (default: every parameter's); 0 exempts them"
    )
SGD_MOMENTUM = 0.9


class RunState(NamedTuple):
    """The state of one run; `train` holds these stacked along a leading runs axis."""

    params: PyTree
    constants: PyTree
    opt_state: PyTree
    data_key: jax.Array


def variables_of(params: PyTree, constants: PyTree) -> dict:
    """A run's Flax variables from its params and (possibly empty) constants."""
    return {"params": params, "constants": constants} if constants else {"params": params}


def is_mask_logits(path: tuple) -> bool:
    """Whether a parameter's key path names an attention mask's logits."""
    return any(getattr(key, "key", None) == "mask_logits" for key in path)


def weight_decay(config: TrainConfig) -> optax.GradientTransformation:
    """Adds decay x params to the updates; the mask logits take `mask_weight_decay` when it is set."""
    if config.mask_weight_decay is None or config.mask_weight_decay == config.weight_decay:
        return optax.add_decayed_weights(config.weight_decay)

    def where(wanted: bool) -> Callable[[PyTree], PyTree]:
        return lambda params: jax.tree_util.tree_map_with_path(lambda p, _: is_mask_logits(p) == wanted, params)

    return optax.chain(
        optax.add_decayed_weights(config.weight_decay, mask=where(False)),
        optax.add_decayed_weights(config.mask_weight_decay, mask=where(True)),
    )


def make_optimizer(config: TrainConfig) -> optax.GradientTransformation:
    """The config's optimizer, weight decay, learning-rate schedule and gradient clipping."""
    optimizer = _optimizer(config)
    if config.clip_norm is None:
        return optimizer
    return optax.chain(optax.clip_by_global_norm(config.clip_norm), optimizer)


def learning_rate(config: TrainConfig) -> optax.ScalarOrSchedule:
    """The config's learning rate: a constant, or optax's cosine schedule (after a linear warmup)."""
    if config.schedule == "constant":
        return config.learning_rate
    if config.schedule == "cosine" and config.warmup_steps:
        return optax.warmup_cosine_decay_schedule(0.0, config.learning_rate, config.warmup_steps, max(1, config.steps))
    if config.schedule == "cosine":
        return optax.cosine_decay_schedule(config.learning_rate, max(1, config.steps))
    raise ConfigError(f"unknown schedule {config.schedule!r}; expected 'constant' or 'cosine'")


def decay_only_fraction(config: TrainConfig) -> float | None:
    """The share of a mask logit that weight decay alone removes over a run: 1 - prod_t (1 - lr_t * wd).

    Why: AdamW's decay is decoupled, so with a zero gradient a logit m becomes m * prod_t (1 - lr_t * wd);
    a mask's measured movement is read beside this, the rest being what the gradient did. None for Adam
    with L2 and SGD, whose decay passes through the normalised or momentum step (no closed form)."""
    if config.optimizer != "adamw":
        return None
    decay = config.weight_decay if config.mask_weight_decay is None else config.mask_weight_decay
    rate = learning_rate(config)
    rates = np.asarray(rate(jnp.arange(config.steps)) if callable(rate) else np.full(config.steps, rate), np.float64)
    return float(1.0 - np.prod(1.0 - rates * decay))


def _optimizer(config: TrainConfig) -> optax.GradientTransformation:
    rate = learning_rate(config)
    if config.mask_weight_decay is not None and not config.mask_weight_decay >= 0:
        raise ConfigError(f"mask weight decay must be >= 0, got {config.mask_weight_decay}")
    if config.optimizer == "adam":
        return optax.chain(weight_decay(config), optax.adam(rate))
    if config.optimizer == "sgd":
        return optax.chain(weight_decay(config), optax.sgd(rate, momentum=SGD_MOMENTUM))
    if config.optimizer == "adamw":
        if config.mask_weight_decay is None:
            return optax.adamw(rate, weight_decay=config.weight_decay)
        # optax.adamw's own chain, with the decay split between the mask logits and the rest.
        return optax.chain(optax.scale_by_adam(), weight_decay(config), optax.scale_by_learning_rate(rate))
    raise ConfigError(f"unknown optimizer {config.optimizer!r}; known: {', '.join(OPTIMIZERS)}")


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
    """The compiled pieces of a batch: `init(keys, *inputs)` -> stacked RunState, and
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
        init=jax.jit(jax.vmap(init_one)),
        chunk=jax.jit(jax.vmap(chunk_one, in_axes=(0, data_axis, None, None)), donate_argnums=0),
        step=jax.jit(jax.vmap(single_step, in_axes=(0, data_axis, None))),
    )


Probe = Callable[[RunState, RunState], dict[str, jax.Array]]


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
    init_run: InitRun,
    loss: Loss,
    run_keys: jax.Array,
    run_inputs: tuple[jax.Array, ...],
    data: PyTree,
    config: TrainConfig,
    log: Log | None = None,
    label: str = "",
    checkpoints: Checkpointer | None = None,
    resume: bool = False,
    probe: Probe | None = None,
    data_per_run: bool = False,
    augment: Augment | None = None,
) -> Trained:
    """Train every run of a batch.

    init_run(key, *inputs) -> (params, constants) for one run; loss(params, constants, batch) -> scalar.
    run_keys [runs] and every array of run_inputs carry the runs axis; data is shared by all runs, or
    with data_per_run carries the runs axis as well.
    probe(initial, state) -> {name: array} for one run is measured at init and after every chunk
    (e.g. how far the attention has drifted). checkpoints saves the batch at chunk ends when due; with
    resume, training continues from its newest readable checkpoint. Checkpoints fall on chunk
    boundaries, so a resumed batch runs the same chunks as an uninterrupted one: the same floats.
    """
    n_train = jax.tree.leaves(data)[0].shape[1 if data_per_run else 0]
    program = compile_program(init_run, loss, n_train, config, data_per_run, augment)
    n_runs = len(run_keys)
    mesh = runs_mesh(n_runs)
    data = shard_runs(data, mesh) if data_per_run else replicate(data, mesh)
    measure = jax.jit(jax.vmap(probe)) if probe is not None else None

    def runs(tree: PyTree) -> PyTree:
        """The real runs, without the padding `shard_runs` added for this mesh."""
        return jax.tree.map(lambda a: a[:n_runs], tree)

    say = log if log is not None else (lambda message: None)
    clock = time.time()
    say(f"{label} compiling and initialising {n_runs} runs on {mesh.size} device(s)")
    initial = init_runs(program, run_keys, run_inputs, mesh)
    state, first_step = jax.tree.map(jnp.copy, initial), 0
    history: dict[str, list[np.ndarray]] = {"loss": []}
    if measure is not None:
        history.update({name: [to_host(v)[:n_runs, None]] for name, v in measure(initial, initial).items()})
    if checkpoints is not None and resume:
        # Checkpoints hold the real runs only, so a batch resumes on any number of devices.
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
    return Trained(
        initial, state, joined.pop("loss"), joined, probe_steps if measure is not None else [], first_step
    )


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


def first_nonfinite_step(history: np.ndarray) -> np.ndarray:
    """Per run, the 1-based step whose loss first became NaN or infinite; 0 where none did."""
    bad = ~np.isfinite(history)
    return np.where(bad.any(axis=1), bad.argmax(axis=1) + 1, 0)


def train_group(
    batch: Any, label: str, log: Log | None, checkpoints: Checkpointer | None, resume: bool, **options: Any
) -> Trained:
    """`train` on a study's batch: anything with init_run, loss, run_keys, run_masks (each run's initial M,
    the one per-run input every study passes), data and train_config. options go to `train` (probe,
    data_per_run, augment)."""
    return train(
        batch.init_run,
        batch.loss,
        batch.run_keys,
        (batch.run_masks,),
        batch.data,
        batch.train_config,
        log,
        label=label,
        checkpoints=checkpoints,
        resume=resume,
        **options,
    )
