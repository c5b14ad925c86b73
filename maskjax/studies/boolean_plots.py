"""The Boolean study's figures beyond the shared ones: the probes per task and the attention maps."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from maskjax import plots
from maskjax.tasks.boolean import BooleanTask

GRADIENT_KEYS = ("grad_norm_mask", "grad_norm_qk")
CHANGE_KEYS = ("mask_change_open_mean", "mask_change_closed_mean", "mask_change_closed_max")


def plot_probes(out: Path, task_name: str, task_records: list[dict]) -> None:
    """loss_TASK.png, drift_TASK.png, gradients_TASK.png and, when a mask was trained, mask_change_TASK.png."""
    plots.plot_loss(task_records, out / f"loss_{task_name}.png")
    plots.plot_drift(task_records, out / f"drift_{task_name}.png")
    plots.plot_drift(task_records, out / f"gradients_{task_name}.png", GRADIENT_KEYS, log=True)
    if any("mask_change_open_mean" in r for r in task_records):
        plots.plot_drift(task_records, out / f"mask_change_{task_name}.png", CHANGE_KEYS, log=True)


def plot_task(
    out: Path, task: BooleanTask, prior: dict[str, np.ndarray], maps: dict[str, dict[str, np.ndarray]]
) -> None:
    """The prior's panels, then per method (seed 0) the layer-0 attention at init and after training (cf. the
    paper's Fig. 5)."""
    labels = ["CLS", *[f"x{i}" for i in range(task.n_bits)]]
    panels = dict(prior)
    for name, attention in maps.items():
        panels[f"{name} layer 0, init"] = attention["init"][0]
        panels[f"{name} layer 0, trained"] = attention["final"][0]
    plots.plot_matrices(panels, out / f"attention_{task.name}.png", labels)
