"""Markdown tables over records: mean +- std, per seed, paired sign tests, Fisher counts."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


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
    from scipy import stats  # imported when a test runs: scipy.stats is most of a CLI's import time

    return float(stats.fisher_exact([[hits_a, n_a - hits_a], [hits_b, n_b - hits_b]])[1])


def sign_test_p(differences: Sequence[float]) -> float:
    """Two-sided sign test of paired differences (ties dropped); 1 when every pair ties."""
    plus = sum(d > 0 for d in differences)
    minus = sum(d < 0 for d in differences)
    from scipy import stats  # imported when a test runs: scipy.stats is most of a CLI's import time

    return float(stats.binomtest(plus, plus + minus).pvalue) if plus + minus else 1.0


def paired_table(
    records: Sequence[dict],
    key: str | Sequence[str],
    reference: str,
    group_by: Sequence[str],
    lower_is_better: bool = False,
    across: str = "method",
) -> str:
    """`reference` against every other value of `across` (the method, or e.g. the source folder of one
    method run two ways), seed by seed, within each group (group_by without `across`): the mean difference
    in key, wins / losses / ties (a win: higher, or lower with lower_is_better, as for perplexity) and the
    two-sided sign test. Several keys (one per layer, say) give one table with a `key` column. Empty when no
    seed pairs the reference with another value (a folder with one method), so a summary leaves it out."""
    keys = [key] if isinstance(key, str) else list(key)
    keyed: dict[tuple, dict[str, dict[str, dict[int, float]]]] = {}
    for r in records:
        if "seed" not in r:
            continue
        group = tuple(r[g] for g in group_by)
        for k in keys:
            if r.get(k) is not None:
                keyed.setdefault(group, {}).setdefault(k, {}).setdefault(r[across], {})[r["seed"]] = r[k]
    in_points = " in points" if all(is_accuracy(k) for k in keys) else ""
    key_column = ["key"] if len(keys) > 1 else []
    header = [*group_by, *key_column, across, f"{reference} - {across} (mean)", "wins / losses / ties", "sign test p"]
    direction = ", lower is better" if lower_is_better else ""
    lines = [
        f"{reference} against each {across}, paired by seed ({', '.join(keys)}{in_points}{direction}):",
        "",
        *markdown_head(header),
    ]
    rows = []
    for group, by_key in keyed.items():
        for k, runs in by_key.items():
            ours, scale = runs.get(reference, {}), 100 if is_accuracy(k) else 1
            for other, theirs in runs.items():
                seeds = sorted(set(ours) & set(theirs))
                if other == reference or not seeds:
                    continue
                diffs = [ours[s] - theirs[s] for s in seeds]
                wins, losses = sum(d > 0 for d in diffs), sum(d < 0 for d in diffs)
                if lower_is_better:
                    wins, losses = losses, wins
                rows.append(
                    markdown_row(
                        [
                            *group,
                            *([k] if key_column else []),
                            other,
                            f"{scale * np.mean(diffs):+.3g}",
                            f"{wins} / {losses} / {len(diffs) - wins - losses}",
                            f"{sign_test_p(diffs):.3g}",
                        ]
                    )
                )
    return "\n".join([*lines, *rows]) + "\n" if rows else ""


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
