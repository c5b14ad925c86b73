"""Tables on a results page that are generated from the records they name, so a page cannot drift from its data.

A generated table sits between two markers that the generator owns:

    <!-- table summary: from=vision_quick/low keys=test_acc,test_loss by=train_fraction,method -->
    | ... the table, as `render` writes it ... |
    <!-- end table -->

`from` lists result folders (relative to the page's own folder; `PARENT/*` stands for each subfolder of
PARENT that holds results, in name order) whose results.jsonl are read and joined (each record gains
its folder's name as `source`, a field `by` and `where` can use, and its end-of-run values,
`maskjax.probes.end_of_run`);
`where=field:value;field:value` keeps the records whose field prints as value (a value may be a `|`
list of choices); `method_as=FOLDER:NAME` shows a folder's records as method NAME (`method_as`); the other
parameters belong to the table's kind (`KINDS`). `refresh(page)` rewrites
every block from its records; `experiments.audit` fails on any page where that changes a character.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from maskjax import probes, runs, store, tables
from maskjax.errors import ConfigError
from maskjax.methods import get_method
from maskjax.optim import decay_only_change

BLOCK = re.compile(r"<!-- table (?P<kind>[\w-]+):(?P<params>[^\n]*?)-->\n(?P<body>.*?)<!-- end table -->", re.S)


def _names(text: str) -> list[str]:
    return [t for t in text.split(",") if t]


def _mdi_reference(records: Sequence[dict]) -> list[dict]:
    """The MDI's own record for each Boolean task the records hold (the row every Boolean summary starts with)."""
    from maskjax.studies import boolean
    from maskjax.tasks.boolean import get_task

    tasks = dict.fromkeys(r["task"] for r in records if "task" in r)
    return [boolean.mdi_record(get_task(name)) for name in tasks]


def _with_paths(records: Sequence[dict], keys: Sequence[str]) -> list[dict]:
    """The records with each dotted key (a `field_value` path such as `mask_change_mean.-1.0`) as a field."""
    paths = [k for k in keys if "." in k]
    return [{**r, **{k: field_value(r, k) for k in paths}} for r in records]


def _summary(records: Sequence[dict], params: dict[str, str], folder: Path) -> str:
    reference = _mdi_reference(records) if params.get("mdi") == "true" else []
    keys = _names(params["keys"])
    return tables.summary_table(_with_paths([*reference, *records], keys), keys, _names(params["by"]))


def _per_seed(records: Sequence[dict], params: dict[str, str], folder: Path) -> str:
    return tables.per_seed_table(_with_paths(records, [params["key"]]), params["key"], _names(params["by"]))


def _paired(records: Sequence[dict], params: dict[str, str], folder: Path) -> str:
    lower, keys, across = params.get("lower") == "true", _names(params["key"]), params.get("across", "method")
    reference = params["reference"]
    table = tables.paired_table(_with_paths(records, keys), keys, reference, _names(params["by"]), lower, across)
    if not table:
        raise ConfigError(f"no seed pairs {reference} with another {across} on {', '.join(keys)}")
    return table


def _count(records: Sequence[dict], params: dict[str, str], folder: Path) -> str:
    by = tuple(_names(params.get("by", "task,method")))
    return tables.count_table(records, _mdi_reference(records), by, params.get("key", "acc_all"))


def _split_path(path: str) -> list[str]:
    """`attention_drift.@0.25.0` -> ['attention_drift', '@0.25', '0']: a fraction after @ keeps its point."""
    return re.findall(r"@\d+(?:\.\d+)?|[^.]+", path)


# The steps each curve was recorded at, where they are not the probes' `drift_steps`.
CURVE_STEPS = {"train_loss_curve": "train_loss_steps"}


def field_value(record: dict, path: str) -> float | None:
    """A field, or an entry of a list field: `degree_profile.1`, `attention_drift.-1.0` (the last probe,
    layer 0), `attention_drift.-1.max` (the largest over the last axis), `attention_drift.@0.25.0` (the
    probe nearest 25% of the run's steps, by its `drift_steps`, or by the curve's own steps in
    CURVE_STEPS); None when the record lacks it."""
    name, *steps = _split_path(path)
    value = record.get(name)
    for step in steps:
        if value is None:
            return None
        if step.startswith("@"):
            probe_steps = np.asarray(record[CURVE_STEPS.get(name, "drift_steps")], np.float64)
            value = value[int(np.argmin(np.abs(probe_steps - float(step[1:]) * record["steps"])))]
        elif step in ("max", "min", "mean"):
            value = float(getattr(np, step)(np.asarray(value, np.float64)))
        else:
            value = value[int(step)]
    return value


def _values(records: Sequence[dict], params: dict[str, str], folder: Path) -> str:
    """One row per record: its `by` fields, then each of `fields` (paths as `field_value` reads them)."""
    by, fields = _names(params["by"]), _names(params["fields"])
    header = [*by, *[f"{f} (%)" if tables.is_accuracy(f) else f for f in fields]]
    lines = tables.markdown_head(header)
    for r in records:
        cells = ["-" if (v := field_value(r, f)) is None else tables.cell(v, f) for f in fields]
        lines.append(tables.markdown_row([*(r.get(b, "-") for b in by), *cells]))
    return "\n".join(lines) + "\n"


def _ladder(records: Sequence[dict], params: dict[str, str], folder: Path) -> str:
    """docs/design.md's ladder rule per rung (`source`) and group: the vanilla runs' key per seed, the
    reference it is held against (`against=`: the softmax-regression or n-gram folder), how many seeds pass
    and the verdict; `rung=NAME` reads every folder as one rung (seeds split over folders); `family=` vision,
    language or arithmetic picks the study's `ladder_rule`, arithmetic_floor
    its `baseline_floor` (the paper's vanilla regime, issue 43), boolean_floor the Boolean study's
    `plateau_floor` (vanilla at the MDI plateau on the seen points)."""
    from maskjax.studies import arithmetic, boolean_rules, language, vision

    family, key, by = params["family"], params["key"], _names(params.get("by", ""))
    reference = records_of(folder, params["against"]) if "against" in params else []
    groups: dict[tuple, list[dict]] = {}
    for r in records:
        if r.get("method") == "vanilla":
            groups.setdefault((params.get("rung", r["source"]), *(r.get(b) for b in by)), []).append(r)
    seeds = sorted({r["seed"] for rows in groups.values() for r in rows})
    header = ["rung", *by, *[f"seed {s}" for s in seeds], "reference", "pass", "rule"]
    lines = tables.markdown_head(header)
    for (source, *group), rows in groups.items():
        if family == "vision":
            fraction = rows[0]["train_fraction"]
            linear = [x for x in reference if x["train_fraction"] == fraction]
            rule = vision.ladder_rule(rows, linear)
            against = ", ".join(tables.cell(x["test_acc"] + vision.LADDER_MARGIN, "test_acc") for x in linear)
        elif family == "language":
            (bigram,) = [x["test_bpb"] for x in reference if x["method"] == "bigram"]
            rule, against = language.ladder_rule(rows, bigram), f"< {bigram:.4g}"
        elif family == "arithmetic":
            rule, against = arithmetic.ladder_rule(rows), f">= {100 * arithmetic.LADDER_FIT:g}"
        elif family == "boolean_floor":
            rule, against = boolean_rules.plateau_floor(rows), f"seen >= {100 * boolean_rules.SEEN_FLOOR:g}"
        elif family == "arithmetic_floor":
            paper = arithmetic.PAPER_VANILLA.get((rows[0]["op"], rows[0]["train_fraction"]))
            rule = arithmetic.baseline_floor(rows)
            against = f">= {tables.cell(paper, 'seq_acc')}, loss fall <= {100 * arithmetic.FLAT_TOLERANCE:g}%"
        else:
            raise ConfigError(
                f"unknown ladder family {family!r}; known: vision, language, arithmetic, arithmetic_floor, "
                "boolean_floor"
            )
        value = boolean_rules.seen_accuracy if family == "boolean_floor" else (lambda r: r.get(key))
        by_seed = {r["seed"]: value(r) for r in rows}
        cells = [tables.cell(by_seed[s], key) if s in by_seed else "-" for s in seeds]
        verdict = "passes" if rule["passes"] else "fails"
        lines.append(tables.markdown_row([source, *group, *cells, against, f"{rule['pass']}/{rule['seeds']}", verdict]))
    return "\n".join(lines) + "\n"


def _decay(records: Sequence[dict], params: dict[str, str], folder: Path) -> str:
    """A learnable mask's movement beside what weight decay alone would have done (issue 44): per method and layer
    (after the fields `by` names, when several tasks share a table), the measured mean |M_T - M_0| at the end
    (`key`, default mask_change_mean), the decay-only change (`optim.decay_only_change` under the run's optimizer
    and schedule, averaged over the layer's entries) and the difference. The entries' M_0 come from the group's maps
    file (`maps=TEMPLATE`, formatted with the record's fields, e.g. `{corpus}_{method}`) or, where every entry the
    key averages starts at the same magnitude, from a field of the sweep's config (`magnitude=FIELD`, e.g.
    open_value). The last column repeats the decay in float32, training's own arithmetic: a mask the data never
    moved matches it to the printed digits. A frozen mask is not a parameter: decay never touches it."""
    key, template, field = params.get("key", "mask_change_mean"), params.get("maps"), params.get("magnitude")
    by = _names(params.get("by", ""))
    if (template is None) == (field is None):
        raise ConfigError("a decay table takes either maps=TEMPLATE or magnitude=FIELD")
    rows: dict[tuple, list[tuple[float, float, float]]] = {}
    for r in records:
        mode = get_method(r["method"]).mask_mode
        if r.get(key) is None or mode == "none":
            continue
        measured_L = r[key][-1]
        alone_L = [(0.0, 0.0)] * len(measured_L)
        if mode == "learnable":
            config, initial_L = runs.record_train_config(r), _initial_masks(r, len(measured_L), folder, template, field)
            alone_L = [
                tuple(float(decay_only_change(config, initial, dtype).mean()) for dtype in ("float64", "float32"))
                for initial in initial_L
            ]
        for layer, (measured, alone) in enumerate(zip(measured_L, alone_L, strict=True)):
            rows.setdefault((*(r.get(b) for b in by), r["method"], layer), []).append((measured, *alone))
    if not rows:
        raise ConfigError(f"no record with a mask carries {key}")
    head = ["measured", "decay alone", "measured - decay alone", "decay alone, float32"]
    lines = tables.markdown_head([*by, "method", "layer", "seeds", *head])
    for group, values in rows.items():
        measured, alone, alone_float32 = (float(np.mean(v)) for v in zip(*values, strict=True))
        cells = [tables.cell(x, "mask_change") for x in (measured, alone, measured - alone, alone_float32)]
        lines.append(tables.markdown_row([*group, len(values), *cells]))
    return "\n".join(lines) + "\n"


def _initial_masks(record: dict, layers: int, folder: Path, template: str | None, field: str | None) -> np.ndarray:
    """M_0 per layer: the maps file's `mask_init`, or the config field's magnitude for every layer (0 for a
    method whose mask starts at zero)."""
    if template is None and get_method(record["method"]).mask_pattern == "zero":
        return np.zeros((layers, 1))
    if template is None:
        value = store.sweep_config(record.get("config") or {}).get(field)
        if not isinstance(value, int | float):
            raise ConfigError(f"a decay table's magnitude={field} names no number in the sweep's config")
        return np.full((layers, 1), value, np.float64)
    path = folder / record["source"] / "maps" / f"{template.format(**record)}.npz"
    if not path.is_file():
        raise ConfigError(f"a decay table needs the maps file {path}")
    return store.read_maps(path)["mask_init"]


Kind = Callable[[Sequence[dict], dict[str, str], Path], str]  # records, the block's parameters, the page's folder
KINDS: dict[str, tuple[Kind, tuple[str, ...]]] = {
    "summary": (_summary, ("keys", "by")),
    "per-seed": (_per_seed, ("key", "by")),
    "paired": (_paired, ("key", "reference", "by")),
    "count": (_count, ()),
    "values": (_values, ("by", "fields")),
    "ladder": (_ladder, ("family", "key")),
    "decay": (_decay, ()),
}


def parse_params(text: str) -> dict[str, str]:
    params = {}
    for item in text.split():
        name, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(f"table parameter {item!r} is not NAME=VALUE")
        params[name] = value
    return params


def select(records: Sequence[dict], where: str) -> list[dict]:
    """The records whose fields print as the `where` values (field:value;field:a|b)."""
    conditions = []
    for clause in filter(None, where.split(";")):
        field, sep, value = clause.partition(":")
        if not sep:
            raise ConfigError(f"where clause {clause!r} is not field:value")
        conditions.append((field, set(value.split("|"))))
    return [r for r in records if all(str(r.get(f)) in values for f, values in conditions)]


def with_derived(record: dict, source: str) -> dict:
    """The record with its folder's name as `source` (unless it has one), its end-of-run values
    (`maskjax.probes.end_of_run`: the drifts, mask changes and gradient norms `experiments.probes` prints),
    how much its training loss still fell over the last tenth (`train_loss_fall`, for records written
    before they carried it) and, for a Boolean run, its accuracy on the seen points (`acc_seen`, which
    issue 43's Cyclic3 floor reads)."""
    from maskjax.studies import boolean_rules
    from maskjax.tasks.boolean import TASKS

    derived = {"train_loss_fall": runs.loss_fall(record)} if record.get("train_loss_curve") else {}
    if record.get("task") in TASKS:
        derived["acc_seen"] = boolean_rules.seen_accuracy(record)
    return {"source": source, **probes.end_of_run(record), **derived, **record}


def source_folders(folder: Path, sources: str) -> list[str]:
    """The `from` list with each `PARENT/*` replaced by PARENT's subfolders that hold a results.jsonl, in
    name order, so a page whose runs share a parent (one method per folder) names them once."""
    names = []
    for name in _names(sources):
        if not name.endswith("/*"):
            names.append(name)
            continue
        parent = name[:-2]
        found = sorted(p.parent.name for p in (folder / parent).glob("*/results.jsonl"))
        if not found:
            raise ConfigError(f"a table names {name}, but no folder under {folder / parent} holds a results.jsonl")
        names.extend(f"{parent}/{child}" for child in found)
    return names


def records_of(folder: Path, sources: str, where: str = "") -> list[dict]:
    found = []
    for name in source_folders(folder, sources):
        path = folder / name / "results.jsonl"
        if not path.is_file():
            raise ConfigError(f"a table names {name}, but {path} does not exist")
        found.extend(with_derived(r, name) for r in store.read_jsonl(path))
    return select(found, where)


def render(kind: str, params: dict[str, str], folder: Path, kinds: dict[str, tuple[Kind, tuple[str, ...]]]) -> str:
    """The table of one block: its kind applied to the records it names."""
    if kind not in kinds:
        raise ConfigError(f"unknown table kind {kind!r}; known: {', '.join(kinds)}")
    make, required = kinds[kind]
    missing = [p for p in ("from", *required) if p not in params]
    if missing:
        raise ConfigError(f"a {kind} table needs {', '.join(missing)}")
    records = records_of(folder, params["from"], params.get("where", ""))
    if not records:
        raise ConfigError(f"a {kind} table from {params['from']} where {params.get('where', '')!r} selects no record")
    return make(method_as(records, params.get("method_as", "")), params, folder)


def method_as(records: Sequence[dict], renames: str) -> list[dict]:
    """`method_as=FOLDER:NAME,...`: the records of a folder shown as method NAME, so that one method run two
    ways (impulse at two position scales) sits beside itself in one table, each its own row or column. The
    `where` clause has already chosen the records by their own method."""
    by_source = {}
    for rename in _names(renames):
        source, sep, name = rename.partition(":")
        if not sep or not name:
            raise ConfigError(f"method_as takes FOLDER:NAME, got {rename!r}")
        by_source[source] = name
    unknown = set(by_source) - {r["source"] for r in records}
    if unknown:
        raise ConfigError(f"method_as names {', '.join(sorted(unknown))}, which the table's records do not come from")
    return [{**r, "method": by_source[r["source"]]} if r["source"] in by_source else r for r in records]


def refresh(text: str, folder: Path, kinds: dict[str, tuple[Kind, tuple[str, ...]]] | None = None) -> str:
    """The page with every generated table rewritten from its records (`folder`: the page's own folder;
    `kinds`: the table kinds, by default `KINDS`; a CLI adds its own study's)."""
    kinds = KINDS if kinds is None else kinds

    def replace(match: re.Match) -> str:
        body = render(match["kind"], parse_params(match["params"]), folder, kinds)
        return f"<!-- table {match['kind']}:{match['params']}-->\n{body}<!-- end table -->"

    return BLOCK.sub(replace, text)


def tables_in(text: str) -> int:
    return len(BLOCK.findall(text))


HAND = re.compile(r"<!-- not from records: [^\n]*?-->")


def unexplained_tables(text: str) -> list[int]:
    """Line numbers of tables that neither a generator owns nor a `<!-- not from records: why -->` line
    just above them explains (the paper's numbers, a cost table, a ladder computed elsewhere)."""
    owned = set()
    for m in BLOCK.finditer(text):
        start = text.count("\n", 0, m.start())
        owned.update(range(start, start + m.group().count("\n") + 1))
    lines, found = text.splitlines(), []
    for i, line in enumerate(lines):
        if not line.startswith("|") or (i and lines[i - 1].startswith("|")) or i in owned:
            continue
        above = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        if not HAND.fullmatch(above.strip()):
            found.append(i + 1)
    return found


NUMBER = re.compile(r"(?<![\w.])[-+]?\d+\.\d+(?:e[-+]?\d+)?(?![\w.]*\d)")
ARXIV_ID = re.compile(r"\b\d{4}\.\d{5}\b")


def numbers_in(text: str) -> list[str]:
    """The decimal numbers written in a piece of text, a leading + dropped."""
    return [m.group().lstrip("+") for m in NUMBER.finditer(text)]


def table_numbers(text: str) -> set[str]:
    """Every decimal number a table on the page shows (any table row, generated or not)."""
    return {n for line in text.splitlines() if line.startswith("|") for n in numbers_in(line)}


def is_shown(number: str, numbers: set[str]) -> bool:
    """Whether a quoted number is a shown one, or a shown one rounded to the quote's decimals (its mantissa's,
    for a number in exponent notation)."""
    if number in numbers:
        return True
    mantissa, _, exponent = number.partition("e")
    decimals = len(mantissa.split(".")[1])
    style = f".{decimals}e" if exponent else f".{decimals}f"
    quoted = f"{float(number):{style}}"
    return any(f"{float(v):{style}}" == quoted for v in numbers)


def explained_numbers(text: str) -> set[str]:
    """Numbers a page lists in a `<!-- not from records: why, numbers -->` comment: quotes of what no record
    holds (corpus sizes, a timing the text gives with its command), each exception written down."""
    return {n for comment in HAND.findall(text) for n in numbers_in(comment)}


GLANCE_HEADING = "## At a glance"
GLANCE_BLOCK = re.compile(r"(<!-- glance: from docs/claims\.md -->\n)(?P<body>.*?)(<!-- end glance -->)", re.S)
EFFECT = re.compile(r"<!-- effect:(?P<params>[^\n]*?)-->")


def glance_table(ledger: str) -> str:
    """The first table under the ledger's "At a glance" heading, as README shows it."""
    if GLANCE_HEADING not in ledger:
        raise ConfigError(f"the ledger has no {GLANCE_HEADING!r} section")
    section = ledger.split(GLANCE_HEADING, 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("|")]
    if not rows:
        raise ConfigError(f"the ledger's {GLANCE_HEADING!r} section has no table")
    return "\n".join(rows) + "\n"


RELATIVE_LINK = re.compile(r"\]\((?![a-z]+:|/|#)")


def with_glance(readme: str, ledger: str) -> str:
    """README with its glance block (`<!-- glance: from docs/claims.md -->` ... `<!-- end glance -->`) rewritten
    from the ledger's table, its relative links (written from docs/) made relative to the repository root."""
    if not GLANCE_BLOCK.search(readme):
        raise ConfigError("README has no <!-- glance: from docs/claims.md --> block")
    table = RELATIVE_LINK.sub("](docs/", glance_table(ledger))
    return GLANCE_BLOCK.sub(lambda m: m.group(1) + table + m.group(3), readme)


def paired_effect(records: Sequence[dict], key: str, a: str, b: str) -> dict:
    """Method a less method b on `key`, paired by seed (seeds where either has no value are left out):
    the mean difference with its 95% t-interval, wins / losses / ties and the two-sided sign test. Accuracies
    are in points, as the tables print them."""
    from scipy import stats

    scale = 100.0 if tables.is_accuracy(key) else 1.0
    by_method = {m: {r["seed"]: r.get(key) for r in records if r["method"] == m} for m in (a, b)}
    seeds = sorted(s for s in by_method[a] if by_method[a][s] is not None and by_method[b].get(s) is not None)
    if len(seeds) < 2:
        raise ConfigError(f"an effect of {a} against {b} on {key} needs two paired seeds, found {len(seeds)}")
    diffs = np.asarray([scale * (by_method[a][s] - by_method[b][s]) for s in seeds], np.float64)
    half = stats.t.ppf(0.975, len(diffs) - 1) * diffs.std(ddof=1) / np.sqrt(len(diffs))
    return {
        "seeds": len(diffs),
        "mean": float(diffs.mean()),
        "low": float(diffs.mean() - half),
        "high": float(diffs.mean() + half),
        "wins": int((diffs > 0).sum()),
        "losses": int((diffs < 0).sum()),
        "p": tables.sign_test_p(diffs),
        "unit": f"{key}, points" if scale != 1.0 else key,
    }


def ledger_effects(ledger: str, results: Path) -> list[dict]:
    """Every `<!-- effect: family=F label=L from=FOLDER key=K a=METHOD b=METHOD [where=...] -->` line of the
    ledger with its paired effect from the records (underscores in the label print as spaces)."""
    effects = []
    for match in EFFECT.finditer(ledger):
        params = parse_params(match["params"])
        missing = [p for p in ("family", "label", "from", "key", "a", "b") if p not in params]
        if missing:
            raise ConfigError(f"an effect line needs {', '.join(missing)}: {match.group()}")
        records = records_of(results, params["from"], params.get("where", ""))
        effect = paired_effect(records, params["key"], params["a"], params["b"])
        effects.append({"family": params["family"], "label": params["label"].replace("_", " "), **effect})
    return effects
