"""Results files, mean +- std tables and plots. Every file is written atomically."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path

import jax
import numpy as np
from scipy import stats

from maskjax.errors import ConfigError, OutputFolderError


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _publish(tmp: str, path: Path) -> None:
    """Give the temp file the mode a plain open() would have (mkstemp makes it 0600), then rename it."""
    os.chmod(tmp, 0o666 & ~_umask())
    os.replace(tmp, path)


def write_atomic(path: Path, text: str) -> None:
    """Write to a temp file beside `path`, then rename: a reader sees the old file or the new, never a torn one.

    In a multi-host job only process 0 writes; every process holds the same gathered results.
    """
    if jax.process_index() != 0:
        return
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        _publish(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_jsonl(path: Path, records: Iterable[dict]) -> None:
    write_atomic(path, "".join(json.dumps(r, sort_keys=True) + "\n" for r in records))


def write_maps(path: Path, maps: dict[str, np.ndarray]) -> None:
    """Small named arrays a plot is drawn from (attention maps, masks of seed 0), in float16, atomically, so
    a resumed sweep can redraw the plots of batches it did not train itself. Only process 0 writes."""
    if jax.process_index() != 0:
        return
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".npz")
    os.close(fd)
    try:
        np.savez_compressed(tmp, **{k: np.asarray(v, np.float16) for k, v in maps.items()})
        _publish(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)


def read_maps(path: Path) -> dict[str, np.ndarray]:
    with np.load(path) as arrays:
        return {k: arrays[k].astype(np.float32) for k in arrays.files}


def read_jsonl(path: Path) -> list[dict]:
    """The records of a results file; a line that is not JSON is bad input, named by file and line."""
    records = []
    for number, line in enumerate(Path(path).read_text().splitlines(), 1):
        if line.strip():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise ConfigError(f"{path}:{number} is not a JSON record ({e.msg})") from None
    return records


def git_commit() -> str:
    """The commit of the code that ran, with '+dirty' when the tree has uncommitted changes."""
    root = Path(__file__).resolve().parent.parent
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"], cwd=root, capture_output=True, text=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return commit + ("+dirty" if dirty else "")


def environment() -> dict:
    """What a result needs beside its config to be reproduced: commit, JAX version, devices."""
    return {
        "git_commit": git_commit(),
        "jax_version": jax.__version__,
        "devices": [str(d) for d in jax.devices()],
        "backend": jax.default_backend(),
    }


def ensure_writable_dir(path: Path) -> Path:
    """Create `path` if needed and prove it takes files; raise OSError with a plain message if not. In a
    multi-host job only process 0 writes, so only it creates and checks the folder."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise OutputFolderError(f"output path {str(path)!r} exists and is not a directory")
    if jax.process_index() != 0:
        return path
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as e:
        raise OutputFolderError(f"output folder {str(path)!r} is not writable ({e.strerror or e})") from None
    return path


def mean_std(values: Sequence[float], scale: float = 1.0, digits: str = ".4g") -> str:
    """'mean +- sample std' of the values that are not None; one value alone; '-' for none."""
    v = scale * np.asarray([x for x in values if x is not None], np.float64)
    if v.size == 0:
        return "-"
    if v.size == 1:
        return f"{v[0]:{digits}}"
    std_digits = ".2f" if digits.endswith("f") else ".2g"
    return f"{v.mean():{digits}} +- {v.std(ddof=1):{std_digits}}"


def is_accuracy(key: str) -> bool:
    return key.startswith("acc") or key.endswith("_acc")


def markdown_row(cells: Sequence[object]) -> str:
    """One row of a markdown table, each cell as str() prints it."""
    return "| " + " | ".join(map(str, cells)) + " |"


def markdown_head(header: Sequence[str]) -> list[str]:
    """A markdown table's header row and the rule under it."""
    return [markdown_row(header), "|" + "---|" * len(header)]


def summary_table(records: Sequence[dict], keys: Sequence[str], group_by: Sequence[str]) -> str:
    """A markdown table: one row per group, mean +- std (sample std over seeds) of each key.

    Accuracies (keys starting with 'acc' or ending in '_acc') are shown in percent. Diverged runs are
    counted, not averaged.
    """
    groups: dict[tuple, list[dict]] = {}
    for r in records:
        groups.setdefault(tuple(r.get(g, "-") for g in group_by), []).append(r)
    header = [*group_by, "seeds", "diverged", *[f"{k} (%)" if is_accuracy(k) else k for k in keys]]
    lines = [*markdown_head(header)]
    for group, rows in groups.items():
        seeded = [r for r in rows if "seed" in r]
        counts = [str(len(seeded)), str(sum(bool(r.get("diverged")) for r in seeded))] if seeded else ["-", "-"]
        cells = [mean_std([r.get(k) for r in rows], *((100.0, ".2f") if is_accuracy(k) else ())) for k in keys]
        lines.append(markdown_row([*group, *counts, *cells]))
    return "\n".join(lines) + "\n"


def cell(value: float | None, key: str) -> str:
    """One value as the tables print it: accuracies in percent, the rest to 4 significant digits."""
    if value is None:
        return "diverged"
    return f"{100 * value:.2f}" if is_accuracy(key) else f"{value:.4g}"


def per_seed_table(records: Sequence[dict], key: str, group_by: Sequence[str]) -> str:
    """A markdown table of one key: a row per group, a column per seed."""
    seeded = [r for r in records if "seed" in r]
    seeds = sorted({r["seed"] for r in seeded})
    groups: dict[tuple, dict[int, dict]] = {}
    for r in seeded:
        groups.setdefault(tuple(r[g] for g in group_by), {})[r["seed"]] = r
    title = f"{key} (%)" if is_accuracy(key) else key
    header = [*group_by, *[f"seed {s}" for s in seeds]]
    lines = [f"{title}, per seed:", "", *markdown_head(header)]
    for group, by_seed in groups.items():
        cells = [cell(by_seed[s].get(key), key) if s in by_seed else "-" for s in seeds]
        lines.append(markdown_row([*group, *cells]))
    return "\n".join(lines) + "\n"


def fisher_p(hits_a: int, n_a: int, hits_b: int, n_b: int) -> float:
    """Two-sided Fisher's exact test of hits_a / n_a against hits_b / n_b."""
    return float(stats.fisher_exact([[hits_a, n_a - hits_a], [hits_b, n_b - hits_b]])[1])


def sign_test_p(differences: Sequence[float]) -> float:
    """Two-sided sign test of paired differences (ties dropped); 1 when every pair ties."""
    plus = sum(d > 0 for d in differences)
    minus = sum(d < 0 for d in differences)
    return float(stats.binomtest(plus, plus + minus).pvalue) if plus + minus else 1.0


def paired_table(
    records: Sequence[dict], key: str, reference: str, group_by: Sequence[str], lower_is_better: bool = False
) -> str:
    """`reference` against every other method, seed by seed, within each group (group_by without
    "method"): the mean difference in key, wins / losses / ties (a win: higher, or lower with
    lower_is_better, as for perplexity) and the two-sided sign test."""
    keyed: dict[tuple, dict[str, dict[int, float]]] = {}
    for r in records:
        if r.get(key) is None or "seed" not in r:
            continue
        group = tuple(r[g] for g in group_by)
        keyed.setdefault(group, {}).setdefault(r["method"], {})[r["seed"]] = r[key]
    scale = 100 if is_accuracy(key) else 1
    header = [*group_by, "method", f"{reference} - method (mean)", "wins / losses / ties", "sign test p"]
    direction = ", lower is better" if lower_is_better else ""
    lines = [
        f"{reference} against each method, paired by seed ({key}{' in points' if scale == 100 else ''}{direction}):",
        "",
        *markdown_head(header),
    ]
    for group, methods in keyed.items():
        ours = methods.get(reference, {})
        for method, theirs in methods.items():
            seeds = sorted(set(ours) & set(theirs))
            if method == reference or not seeds:
                continue
            diffs = [ours[s] - theirs[s] for s in seeds]
            wins, losses = sum(d > 0 for d in diffs), sum(d < 0 for d in diffs)
            if lower_is_better:
                wins, losses = losses, wins
            lines.append(
                markdown_row(
                    [
                        *group,
                        method,
                        f"{scale * np.mean(diffs):+.3g}",
                        f"{wins} / {losses} / {len(diffs) - wins - losses}",
                        f"{sign_test_p(diffs):.3g}",
                    ]
                )
            )
    return "\n".join(lines) + "\n"


MDI_MARGIN = 0.005


def count_table(
    records: Sequence[dict],
    reference: Sequence[dict],
    group_by: Sequence[str] = ("task", "method"),
    key: str = "acc_all",
    control: str = "vanilla",
) -> str:
    """Per group, how many seeds reach the reference's score (the task's MDI), how many score above
    it and how many reach 100%, with Fisher's exact test of each count against the control method's in
    the same group. "Reach" and "above" allow half a percentage point either
    way (MDI_MARGIN): a run at 87.503% has not left an 87.5% plateau."""
    mdi = {r["task"]: r[key] for r in reference}
    groups: dict[tuple, list[dict]] = {}
    for r in records:
        if "seed" in r and r["task"] in mdi:
            groups.setdefault(tuple(r[g] for g in group_by), []).append(r)

    def counts(rows: list[dict]) -> tuple[int, int, int, int]:
        scored = [v for v in (r.get(key) for r in rows) if v is not None]
        level = mdi[rows[0]["task"]]
        reach = sum(v >= level - MDI_MARGIN for v in scored)
        above = sum(v > level + MDI_MARGIN for v in scored)
        return len(rows), reach, above, sum(v >= 1 - 1e-9 for v in scored)

    def others(group: tuple) -> tuple:
        """The group without its method: the control it is tested against shares these."""
        return tuple(v for name, v in zip(group_by, group, strict=True) if name != "method")

    controls = {others(g): counts(rows) for g, rows in groups.items() if rows[0]["method"] == control}
    header = [
        *group_by,
        "seeds",
        "reach MDI",
        "above MDI",
        "at 100%",
        f"Fisher p vs {control}: reach / above / at 100%",
    ]
    lines = [*markdown_head(header)]
    for group, rows in groups.items():
        n, reach, above, perfect = counts(rows)
        base = controls.get(others(group))
        test = "-"
        if base is not None and rows[0]["method"] != control:
            test = " / ".join(
                f"{fisher_p(k, n, base[i], base[0]):.3g}" for i, k in ((1, reach), (2, above), (3, perfect))
            )
        cells = [str(n), f"{reach}/{n}", f"{above}/{n}", f"{perfect}/{n}", test]
        lines.append(markdown_row([*group, *cells]))
    return "\n".join(lines) + "\n"


def plot_accuracy(records: Sequence[dict], path: Path, key: str = "acc_all", reference: str = "mdi") -> None:
    """Accuracy per task and method with every seed shown; the reference method as a dashed line."""
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
            ax.scatter(i + np.asarray(jitter), values, s=14, alpha=0.7)
            ax.hlines(np.mean(values), i - 0.3, i + 0.3, color="k")
        for r in records:
            if r["task"] == task and r["method"] == reference:
                ax.axhline(100 * r[key], ls="--", color="gray", label=reference)
        ax.set_xticks(range(len(methods)), methods, rotation=30, ha="right")
        ax.set_title(task)
        ax.set_ylabel(f"{key} (%)")
    axes[0][0].legend(loc="lower left", fontsize=8)
    fig.tight_layout()
    save_figure(fig, path)


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


def plot_drift(
    records: Sequence[dict], path: Path, keys: Sequence[str] = DRIFT_KEYS, log: bool = False, per_layer: bool = True
) -> None:
    """Per drift key, one panel per layer (wrapped PANELS_PER_ROW to a row): the mean over seeds against training
    step, per method, with the seed range shaded (log y axis with `log`). Records carry `drift_steps` and, per
    key, [steps][layers] values; `per_layer=False` titles the panels by key, for curves with one value a step."""
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
            for method in methods:
                runs = [r for r in records if r["method"] == method and key in r]
                if not runs:
                    continue
                values = np.asarray([[step[layer] for step in r[key]] for r in runs], np.float64)
                steps = runs[0]["drift_steps"]
                ax.plot(steps, values.mean(0), label=method)
                ax.fill_between(steps, values.min(0), values.max(0), alpha=0.2)
            ax.set_title(f"layer {layer}" if per_layer else key, fontsize=9)
            if log:
                ax.set_yscale("symlog", linthresh=1e-8)
            ax.set_xlabel("step")
            ax.set_ylabel(key, fontsize=8)
    if layers:
        axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    save_figure(fig, path)


def plot_step_curves(
    records: Sequence[dict], path: Path, keys: Sequence[str], steps_key: str = "drift_steps", log: bool = False
) -> None:
    """plot_drift for curves with one value a step (a loss, not a per-layer probe): one panel per key, the
    steps read from `steps_key`."""
    as_layers = [
        {**r, "drift_steps": r.get(steps_key), **{k: [[v] for v in r[k]] for k in keys if k in r}} for r in records
    ]
    plot_drift(as_layers, path, keys, log=log, per_layer=False)


def plot_loss(records: Sequence[dict], path: Path) -> None:
    """Training loss against step on a log axis, per method: the mean over seeds, the seed range shaded.
    Runs without a finite `train_loss_curve` (diverged, or written before it was recorded) are left out."""
    curves = [r for r in records if r.get("train_loss_curve") and None not in r["train_loss_curve"]]
    if curves:
        plot_step_curves(curves, path, ("train_loss_curve",), steps_key="train_loss_steps", log=True)


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
    if jax.process_index() != 0:
        return
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".png")
    os.close(fd)
    try:
        fig.savefig(tmp, dpi=110)
        _publish(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)
