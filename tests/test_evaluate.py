"""`runs.evaluate_runs`, the one evaluator of every study: any split, any eval batch, shared or per-run data."""

import jax.numpy as jnp
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from maskjax import runs
from maskjax.train import RunState


def state_of(weights_R: np.ndarray) -> RunState:
    """A stacked state of linear 'models' y = w x, one weight per run."""
    runs_axis = len(weights_R)
    return RunState({"w": jnp.asarray(weights_R, jnp.float32)}, {}, {}, jnp.zeros(runs_axis))


@settings(deadline=None, max_examples=12)
@given(n=st.integers(1, 23), eval_batch=st.integers(1, 30), n_runs=st.integers(1, 3), per_run=st.booleans())
def test_sums_and_outputs_equal_numpy_for_every_split_and_eval_batch(n, eval_batch, n_runs, per_run):
    rng = np.random.default_rng([n, eval_batch, n_runs])
    weights = rng.normal(size=n_runs)
    x = rng.normal(size=(n_runs, n) if per_run else (n,)).astype(np.float32)
    y = rng.normal(size=x.shape).astype(np.float32)

    def squared_error(variables, chunk, filler):
        xb, yb = chunk
        error = (variables["params"]["w"] * xb - yb) ** 2
        return error.sum() if filler is None else (error * filler).sum()

    def prediction(variables, chunk, filler):
        return variables["params"]["w"] * chunk[0]

    state = state_of(weights)
    sse = runs.evaluate_runs(squared_error, state, [x, y], eval_batch, data_per_run=per_run)
    predicted = runs.evaluate_runs(prediction, state, [x, y], eval_batch, summed=False, data_per_run=per_run)
    x64, y64 = np.broadcast_to(x, (n_runs, n)).astype(np.float64), np.broadcast_to(y, (n_runs, n))
    w64 = np.asarray(weights, np.float32).astype(np.float64)[:, None]
    assert sse.shape == (n_runs,) and predicted.shape == (n_runs, n)
    np.testing.assert_allclose(sse, ((w64 * x64 - y64) ** 2).sum(1), rtol=1e-5)
    np.testing.assert_allclose(predicted, w64 * x64, rtol=1e-6)
