"""Figures drawn from records, without pyplot; every file written atomically by process 0. The module
imports no JAX, so that a child of `maskjax.drawing` draws the figures that a `batch()` sends it."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from maskjax.drawing import drawn
from maskjax.files import replacing


@drawn
def plot_accuracy(records: Sequence[dict], path: Path, key: str = "acc_all", reference: str = "mdi") -> None:
    """Accuracy per task and method with every seed shown; the reference method as a dashed line. A method
    keeps one colour and one x position in every panel, also where a task lacks some methods."""
    tasks = list(dict.fromkeys(r["task"] for r in records))
    methods = list(dict.fromkeys(r["method"] for r in records if r["method"] != reference))
    fig, axes = figure(1, len(tasks), 3.2, 3.2)
    for ax, task in zip(axes[0], tasks, strict=True):
        for i, method in enumerate(methods):
            values = [
                100 * r[key] for r in records if r["task"] == task and r["method"] == method and r[key] is not None
            ]
            if not values:  # not trained yet on this task, or every seed diverged
                continue
            jitter = np.linspace(-0.15, 0.15, len(values)) if len(values) > 1 else [0.0]
            ax.scatter(i + np.asarray(jitter), values, s=14, alpha=0.7, color=f"C{i}")
            ax.hlines(np.mean(values), i - 0.3, i + 0.3, color="k")
        for r in records:
            if r["task"] == task and r["method"] == reference:
                ax.axhline(100 * r[key], ls="--", color="gray", label=reference)
        ax.set_xticks(range(len(methods)), methods, rotation=30, ha="right")
        ax.set_title(task)
        ax.set_ylabel(f"{key} (%)")
    if axes[0][0].get_legend_handles_labels()[0]:  # the first task has a reference line
        axes[0][0].legend(loc="lower left", fontsize=8)
    fig.tight_layout()
    save_figure(fig, path)


@drawn
def plot_curves(records: Sequence[dict], path: Path, *, x: str, y: str, panel: str, line: str) -> None:
    """y (in percent) against x on a log axis, one panel per value of `panel`, one line per value of `line`:
    the mean over seeds, every seed as a dot."""
    panels = list(dict.fromkeys(r[panel] for r in records))
    lines = list(dict.fromkeys(r[line] for r in records))
    fig, axes = figure(1, len(panels), 3.8, 3.2)
    for ax, name in zip(axes[0], panels, strict=True):
        for label in lines:
            rows = [r for r in records if r[panel] == name and r[line] == label and r[y] is not None]
            xs = sorted({r[x] for r in rows})
            means = [100 * np.mean([r[y] for r in rows if r[x] == v]) for v in xs]
            (drawn,) = ax.plot(xs, means, marker="o", label=str(label))
            ax.scatter([r[x] for r in rows], [100 * r[y] for r in rows], s=8, alpha=0.4, color=drawn.get_color())
        ax.set_xscale("log")
        ax.set_xlabel(x)
        ax.set_ylabel(f"{y} (%)")
        ax.set_title(str(name))
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, path)


DRIFT_KEYS = ("attention_drift", "attention_drift_unseen", "prior_logit_drift")
PANELS_PER_ROW = 4


@drawn
def plot_drift(
    records: Sequence[dict], path: Path, keys: Sequence[str] = DRIFT_KEYS, log: bool = False, per_layer: bool = True
) -> None:
    """Per drift key, one panel per layer (wrapped PANELS_PER_ROW to a row): the mean over seeds against training
    step, per method, with the seed range shaded (log y axis with `log`). Records carry `drift_steps` and, per
    key, [steps][layers] values; `per_layer=False` titles the panels by key, for curves with one value a step.
    A method keeps one colour in every panel, also where only some methods carry a key (the masks' own
    curves), so one legend reads them all."""
    from matplotlib.ticker import FuncFormatter

    records = [r for r in records if r.get("drift_steps")]
    methods = list(dict.fromkeys(r["method"] for r in records))
    keys = [k for k in keys if any(k in r for r in records)]
    layers = len(next(r[keys[0]][0] for r in records if keys[0] in r)) if keys else 0
    columns = min(max(layers, 1), PANELS_PER_ROW)
    rows_per_key = -(-max(layers, 1) // columns)
    fig, axes = figure(max(len(keys), 1) * rows_per_key, columns, 3.6, 3.0)
    for ax in axes.flat:
        ax.axis("off")
    for row, key in enumerate(keys):
        for layer in range(layers):
            ax = axes[row * rows_per_key + layer // columns][layer % columns]
            ax.axis("on")
            for index, method in enumerate(methods):
                runs = [r for r in records if r["method"] == method and key in r]
                if not runs:
                    continue
                values = np.asarray([[step[layer] for step in r[key]] for r in runs], np.float64)
                steps = runs[0]["drift_steps"]
                color = f"C{index}"
                ax.plot(steps, values.mean(0), label=method, color=color)
                ax.fill_between(steps, values.min(0), values.max(0), alpha=0.2, color=color)
            ax.set_title(f"layer {layer}" if per_layer else key, fontsize=9)
            if log:
                ax.set_yscale("symlog", linthresh=1e-8)
                # Plain "-1e-08" labels: the default's mathtext labels were a third of the figure's time.
                ax.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:.0e}" if value else "0"))
            ax.set_xlabel("step")
            ax.set_ylabel(key, fontsize=8)
    if layers:
        axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    save_figure(fig, path)


@drawn
def plot_step_curves(
    records: Sequence[dict], path: Path, keys: Sequence[str], steps_key: str = "drift_steps", log: bool = False
) -> None:
    """plot_drift for curves with one value a step (a loss, not a per-layer probe): one panel per key, the
    steps read from `steps_key`."""
    as_layers = [
        {**r, "drift_steps": r.get(steps_key), **{k: [[v] for v in r[k]] for k in keys if k in r}} for r in records
    ]
    plot_drift(as_layers, path, keys, log=log, per_layer=False)


@drawn
def plot_loss(records: Sequence[dict], path: Path) -> None:
    """Training loss against step on a log axis, per method: the mean over seeds, the seed range shaded.
    Runs without a finite `train_loss_curve` (diverged, or written before it was recorded) are left out."""
    curves = [r for r in records if r.get("train_loss_curve") and None not in r["train_loss_curve"]]
    if curves:
        plot_step_curves(curves, path, ("train_loss_curve",), steps_key="train_loss_steps", log=True)


@drawn
def plot_matrices(
    matrices: dict[str, np.ndarray], path: Path, labels: Sequence[str] | None = None, columns: int = 2
) -> None:
    """One heat map per named [N, N] matrix, `columns` to a row (queries down, keys across)."""
    rows = -(-len(matrices) // columns)
    fig, axes = figure(rows, columns, 3.4, 3.2)
    for ax in axes.flat[len(matrices) :]:
        ax.axis("off")
    for ax, (title, matrix) in zip(axes.flat, matrices.items(), strict=False):
        image = ax.imshow(np.asarray(matrix), cmap="viridis")
        ax.set_title(title, fontsize=9)
        if labels is not None:
            ax.set_xticks(range(len(labels)), labels, fontsize=5, rotation=90)
            ax.set_yticks(range(len(labels)), labels, fontsize=5)
        fig.colorbar(image, ax=ax, fraction=0.046)
    fig.tight_layout()
    save_figure(fig, path)


@drawn
def plot_heatmap(grid: np.ndarray, rows: Sequence[str], columns: Sequence[str], path: Path, title: str) -> None:
    """A labelled heat map with each cell's value written in it."""
    fig, axes = figure(1, 1, 1.2 * len(columns) + 2, 1.0 * len(rows) + 1.5)
    ax = axes[0][0]
    image = ax.imshow(grid, cmap="viridis")
    ax.set_xticks(range(len(columns)), columns)
    ax.set_yticks(range(len(rows)), rows)
    ax.set_xlabel("closed logit")
    ax.set_ylabel("open logit")
    for (i, j), value in np.ndenumerate(grid):
        ax.text(j, i, "-" if np.isnan(value) else f"{value:.1f}", ha="center", va="center", color="w", fontsize=8)
    ax.set_title(title, fontsize=9)
    fig.colorbar(image, ax=ax, fraction=0.046)
    fig.tight_layout()
    save_figure(fig, path)


def figure(rows: int, columns: int, width: float, height: float):
    """A figure of rows x columns panels, each width x height inches, built without pyplot so that a
    notebook's matplotlib backend is never switched; axes always 2-D."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width * columns, height * rows))
    return fig, fig.subplots(rows, columns, squeeze=False)


def save_figure(fig, path: Path) -> None:
    if not _is_process_zero():
        return
    with replacing(Path(path), ".png") as tmp:
        fig.savefig(tmp, dpi=110)


def _is_process_zero() -> bool:
    """Process 0 of a multi-host JAX job draws; an interpreter that never imported JAX (a drawing child,
    whose parent is process 0) is in no such job."""
    jax = sys.modules.get("jax")
    return jax is None or jax.process_index() == 0


@drawn
def plot_effects(effects: Sequence[dict], path: Path) -> None:
    """One panel per family: each effect's mean paired difference with its 95% interval, zero marked; a
    family's panel has its own units (points of accuracy, or bits per byte)."""
    families = list(dict.fromkeys(e["family"] for e in effects))
    tallest = max(sum(e["family"] == family for e in effects) for family in families)
    fig, axes = figure(len(families), 1, 7.0, 0.55 * tallest + 1.0)
    for family, ax in zip(families, axes[:, 0], strict=True):
        rows = [e for e in effects if e["family"] == family]
        y = np.arange(len(rows))[::-1]
        means = np.asarray([e["mean"] for e in rows])
        errors = np.asarray([[e["mean"] - e["low"] for e in rows], [e["high"] - e["mean"] for e in rows]])
        ax.errorbar(means, y, xerr=errors, fmt="o", capsize=3)
        ax.axvline(0.0, color="grey", lw=0.8)
        ax.set_yticks(y, [f"{e['label']} ({e['wins']}/{e['seeds']}, p = {e['p']:.3g})" for e in rows], fontsize=8)
        ax.set_ylim(-0.5, tallest - 0.5)
        ax.set_title(family, fontsize=9)
        ax.set_xlabel("difference (95% interval): " + ", ".join(dict.fromkeys(e["unit"] for e in rows)))
    fig.tight_layout()
    save_figure(fig, path)
