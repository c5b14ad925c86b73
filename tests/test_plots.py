import matplotlib
import numpy as np
from matplotlib.collections import PathCollection

from maskjax import plots, runner, runs, store


def png_width(path):
    return int.from_bytes(path.read_bytes()[16:20], "big")


def test_plots_leave_a_notebooks_backend_alone_and_wrap_many_layers(tmp_path):
    matplotlib.use("svg")
    steps = [0, 10, 20]
    records = [
        {"method": m, "drift_steps": steps, "attention_drift": [[0.1 * s] * 12 for s in range(3)]}
        for m in ("vanilla", "mask")
    ]
    plots.plot_drift(records, tmp_path / "drift.png", ["attention_drift"])
    assert matplotlib.get_backend() == "svg"
    assert png_width(tmp_path / "drift.png") <= 3.6 * plots.PANELS_PER_ROW * 110 + 1


def test_a_method_keeps_its_colour_in_panels_where_others_are_missing(tmp_path, monkeypatch):
    drawn = []
    monkeypatch.setattr(plots, "save_figure", lambda fig, path: drawn.append(fig))
    steps = [0, 10]
    records = [
        {"method": "vanilla", "drift_steps": steps, "attention_drift": [[0.1], [0.2]]},
        {"method": "mask", "drift_steps": steps, "attention_drift": [[0.0], [0.1]], "mask_change_mean": [[0], [1]]},
    ]
    plots.plot_drift(records, tmp_path / "drift.png", ["attention_drift", "mask_change_mean"])
    (fig,) = drawn
    colours = [{line.get_label(): line.get_color() for line in ax.get_lines()} for ax in fig.axes if ax.get_lines()]
    assert [sorted(c) for c in colours] == [["mask", "vanilla"], ["mask"]]
    assert colours[0]["mask"] == colours[1]["mask"] != colours[0]["vanilla"]


def test_maps_round_trip_in_float16(tmp_path):
    maps = {"init": np.eye(3), "final": np.full((2, 3, 3), 0.25)}
    store.write_maps(tmp_path / "m" / "a.npz", maps)
    back = store.read_maps(tmp_path / "m" / "a.npz")
    assert back.keys() == maps.keys() and back["final"].shape == (2, 3, 3)
    np.testing.assert_allclose(back["init"], np.eye(3))


def test_accuracy_plot_of_a_sweep_in_progress_leaves_untrained_methods_out(tmp_path):
    # Mid-sweep: 2parity has both methods, threesym only vanilla so far.
    records = [
        {"task": "2parity", "method": "mdi", "acc_all": 0.75},
        {"task": "threesym", "method": "mdi", "acc_all": 0.625},
        *[{"task": "2parity", "method": m, "seed": s, "acc_all": 0.75} for m in ("vanilla", "mask") for s in (0, 1)],
        {"task": "threesym", "method": "vanilla", "seed": 0, "acc_all": 0.5},
    ]
    plots.plot_accuracy(records, tmp_path / "accuracy.png")
    assert (tmp_path / "accuracy.png").read_bytes()[:4] == b"\x89PNG"


def test_accuracy_plot_keeps_a_methods_colour_where_a_task_lacks_another(tmp_path, monkeypatch):
    drawn = []
    monkeypatch.setattr(plots, "save_figure", lambda fig, path: drawn.append(fig))
    records = [
        *[{"task": "2parity", "method": m, "seed": 0, "acc_all": 0.75} for m in ("vanilla", "mask")],
        {"task": "threesym", "method": "mask", "seed": 0, "acc_all": 0.5},
    ]
    plots.plot_accuracy(records, tmp_path / "accuracy.png")
    (fig,) = drawn
    dots = [[c for c in ax.collections if isinstance(c, PathCollection)] for ax in fig.axes]
    colours = [[tuple(c.get_facecolor()[0]) for c in panel] for panel in dots]
    assert len(colours[0]) == 2 and len(colours[1]) == 1
    assert colours[1][0] == colours[0][1] != colours[0][0]


def test_a_sweep_draws_after_a_batch_when_due_and_at_the_end_only_what_is_not_drawn(tmp_path):

    def spec(method):
        return runner.GroupSpec(method, {"method": method}, 1, lambda checkpoints, resume: [{"method": method}])

    def run(plot_every, control):
        drawn = []
        specs = [spec("vanilla"), spec("mask")]
        write = lambda out, records: store.write_jsonl(out / "results.jsonl", records)  # noqa: E731
        plot = lambda records: drawn.append(len(records))  # noqa: E731  (the list grows after the call)
        runner.run_sweep(tmp_path / "out", {"c": 1}, specs, write, control, lambda m: None, plot, plot_every)
        return drawn

    assert run(plot_every=0.0, control=runner.RunControl()) == [1, 2]  # after each batch; the end has nothing new
    assert run(plot_every=1e9, control=runner.RunControl(overwrite=True)) == [2]  # only at the end
    assert run(plot_every=0.0, control=runner.RunControl(resume=True)) == [2]  # a resumed folder is redrawn


def test_loss_curve_is_the_mean_of_equal_windows_and_none_where_a_window_diverged():
    losses = np.arange(1, 46, dtype=np.float64) / 7.0
    steps, curve = runs.loss_curve(losses, points=4)
    assert steps == [12, 23, 34, 45]
    reference = [losses[a:b].mean() for a, b in ((0, 12), (12, 23), (23, 34), (34, 45))]
    np.testing.assert_allclose(curve, reference, rtol=1e-6)
    assert runs.loss_curve(losses[:3]) == ([1, 2, 3], [float(f"{v:.6g}") for v in losses[:3]])
    losses[30] = np.nan
    assert runs.loss_curve(losses, points=4)[1][2] is None
    assert runs.loss_curve(np.zeros(0)) == ([], [])


def test_loss_plot_leaves_out_runs_without_a_finite_curve(tmp_path):
    finite = {"method": "mask", "train_loss_steps": [5, 10], "train_loss_curve": [0.5, 1e-6]}
    plots.plot_loss(
        [finite, {"method": "vanilla", "train_loss_steps": [5, 10], "train_loss_curve": [0.5, None]}],
        tmp_path / "loss.png",
    )
    assert (tmp_path / "loss.png").read_bytes()[:4] == b"\x89PNG"
    plots.plot_loss([{"method": "vanilla", "train_loss": 0.1}], tmp_path / "old.png")
    assert not (tmp_path / "old.png").exists()


def test_log_axes_label_their_ticks_in_plain_signed_text(tmp_path, monkeypatch):
    """Symlog ticks read "-1e-08", not mathtext (a third of a figure's time): the sign must survive."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    drawn = []
    monkeypatch.setattr(plots, "save_figure", lambda fig, path: drawn.append(fig))
    records = [{"method": "vanilla", "drift_steps": [0, 10], "grad_norm_mask": [[0.0], [0.0]]}]
    plots.plot_drift(records, tmp_path / "g.png", ["grad_norm_mask"], log=True)
    (fig,) = drawn
    FigureCanvasAgg(fig).draw()
    labels = [t.get_text() for t in fig.axes[0].get_yticklabels() if t.get_text()]
    assert "0" in labels and "1e-01" in labels and "-1e-01" in labels
    assert not any("$" in label for label in labels)
