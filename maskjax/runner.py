"""The one sweep runner: check the output folder, write config.json, skip the groups of runs already in
results.jsonl, checkpoint each group, append its records and rewrite the outputs atomically."""

from __future__ import annotations

import dataclasses
import json
import shutil
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import jax

from maskjax import drawing, overrides, store
from maskjax.checkpoint import SweepCheckpoints
from maskjax.errors import ConfigError
from maskjax.study import Group, Plan, Study, group_name

Log = Callable[[str], None]


def progress(message: str) -> None:
    """The default log: one line on stderr, flushed, so a long run shows where it is."""
    print(message, file=sys.stderr, flush=True)


SEEDS_EXPECTED = "expected at least one seed, none negative or repeated"


def seeds_ok(seeds: Sequence[int]) -> bool:
    """A sweep's seeds: at least one, none negative, none twice (a repeated seed is the same run)."""
    return bool(seeds) and min(seeds) >= 0 and len(set(seeds)) == len(seeds)


class SweepError(ConfigError):
    """An output folder that cannot be used as asked (another config, nothing to resume)."""


@dataclasses.dataclass(frozen=True)
class RunControl:
    """How a sweep treats its output folder: checkpoint cadence, resume, overwrite."""

    checkpoint_every: int | None = None
    resume: bool = False
    overwrite: bool = False


@dataclasses.dataclass(frozen=True)
class GroupSpec:
    """One vmapped group of a sweep. fields: the record fields all its runs share and that name it in
    results.jsonl (e.g. task and method); runs: how many records it writes; train(checkpoints, resume)
    trains it and returns its records."""

    name: str
    fields: dict[str, Any]
    runs: int
    train: Callable[[SweepCheckpoints, bool], list[dict]]

    def done_in(self, records: list[dict]) -> bool:
        return sum(all(r.get(k) == v for k, v in self.fields.items()) for r in records) == self.runs


def same_sweep(held: dict, wanted: dict, defaults: Mapping[str, Any]) -> bool:
    """Whether a folder's config.json (less its environment) is the wanted sweep: equal, in the nested form or
    the flat one older folders hold, but for config fields added since the folder was written, which the wanted
    sweep holds at their `defaults` (so adding a field to a study's config keeps its folders resumable)."""
    candidates = [wanted, flat_sweep_record(wanted)] if store.is_nested(wanted) else [wanted]
    for candidate in candidates:
        kept = without_added(store.sweep_config(candidate), store.sweep_config(held), defaults)
        if held == ({**candidate, "config": kept} if store.is_nested(candidate) else kept):
            return True
    return False


def without_added(config: dict, held: dict, defaults: Mapping[str, Any]) -> dict:
    """`config` less the fields `held` lacks that sit at their defaults, at any depth (a model field too)."""
    kept = {}
    for key, value in config.items():
        if key not in held:
            if key in defaults and value == defaults[key]:
                continue
        elif isinstance(value, dict) and isinstance(held[key], dict) and isinstance(defaults.get(key), dict):
            value = without_added(value, held[key], defaults[key])
        kept[key] = value
    return kept


def field_defaults(config: Any) -> dict[str, Any]:
    """A config dataclass's fields that have a default, as config.json holds them; for a nested config (the
    model's), its own fields' defaults."""
    found = {}
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            found[f.name] = field_defaults(value)
        elif f.default is not dataclasses.MISSING:
            found[f.name] = json.loads(json.dumps(jsonable(f.default), default=str))
    return found


def prepare_out(out: Path, config: dict, control: RunControl, defaults: Mapping[str, Any] | None = None) -> list[dict]:
    """Check `out` against the config it holds; return the records a resumed run keeps.

    A folder with results of another config is refused unless overwrite, and so is one with results of
    this config unless resume or overwrite: a repeated command never replaces results silently. resume
    needs a folder written by the same config (`same_sweep`; defaults: the config fields' defaults).
    `config` excludes the environment (commit, devices).
    """
    out = store.ensure_writable_dir(out)
    config_path, results_path = out / "config.json", out / "results.jsonl"
    held = None
    if config_path.exists():
        try:
            held = {k: v for k, v in json.loads(config_path.read_text()).items() if k != "environment"}
        except (OSError, json.JSONDecodeError):
            raise SweepError(f"{config_path} is unreadable; pass --overwrite to start afresh") from None
    wanted = json.loads(json.dumps(config, default=str))
    same = held is not None and same_sweep(held, wanted, defaults or {})
    if control.resume and control.overwrite:
        raise SweepError("--resume and --overwrite exclude each other")
    if control.resume:
        if held is None:
            raise SweepError(f"nothing to resume in {out}: no config.json from an earlier run")
        if not same:
            raise SweepError(f"cannot resume: {out} holds a run of a different config")
        return store.read_jsonl(results_path) if results_path.exists() else []
    if held is not None and not same and not control.overwrite:
        raise SweepError(f"{out} holds results of a different config; pass --overwrite or choose another --out")
    held_records = store.read_jsonl(results_path) if results_path.exists() else []
    if held_records and not control.overwrite:
        raise SweepError(
            f"{out} already holds {len(held_records)} results of this config; pass --resume to continue it, "
            "--overwrite to replace it, or choose another --out"
        )
    if control.overwrite:
        set_aside(out)
        remove_tree(out / "checkpoints")
    return []


# What an overwritten sweep's results are moved into, under out/, before anything new is written.
REPLACED = "replaced"
RESULT_FILES = ("results.jsonl", "summary.md", "maps")


def set_aside(out: Path) -> None:
    """Move the results of the sweep an --overwrite replaces into out/replaced/<time>/ (process 0 only).

    Why: left in place, an interrupted new sweep would later `--resume` over the old records and adopt
    them as its own; moved aside (each a rename, atomic), they can neither be adopted nor lost."""
    present = [out / name for name in RESULT_FILES if (out / name).exists()]
    if not present or jax.process_index() != 0:
        return
    aside = out / REPLACED / time.strftime("%Y%m%dT%H%M%S", time.gmtime())
    while aside.exists():
        aside = aside.with_name(aside.name + "+")
    aside.mkdir(parents=True)
    for path in present:
        path.rename(aside / path.name)


def remove_tree(path: Path) -> None:
    """Remove a folder, from process 0 only: in a multi-host job every process runs the sweep, one writes."""
    if jax.process_index() == 0:
        shutil.rmtree(path, ignore_errors=True)


def open_sweep(
    out: Path, config: dict, control: RunControl, defaults: Mapping[str, Any] | None = None
) -> tuple[list[dict], dict]:
    """Prepare `out`; return (records kept from a resumed run, the metadata every new record carries:
    config, git commit, JAX version, devices).

    config.json keeps the environment the sweep was first opened in: a resume (which may only redraw
    the figures) leaves it alone, since each record carries the environment it ran in.
    """
    records = prepare_out(out, config, control, defaults)
    env = store.environment()
    if not control.resume:
        store.write_atomic(out / "config.json", json.dumps({**config, "environment": env}, indent=2) + "\n")
    return records, {"config": config, **env}


def group_checkpoints(out: Path, name: str, fingerprint: dict, control: RunControl) -> SweepCheckpoints:
    """Checkpoints of one group of runs under out/checkpoints/name; a fresh (not resumed) run clears old ones."""
    directory = out / "checkpoints" / name
    if not control.resume:
        remove_tree(directory)
    return SweepCheckpoints(directory, fingerprint, control.checkpoint_every)


PLOT_EVERY_SECONDS = 300.0


def run_sweep(
    out: Path,
    config: dict,
    groups: Sequence[GroupSpec],
    write: Callable[[Path, list[dict]], Any],
    control: RunControl,
    log: Log,
    plot: Callable[[list[dict]], None] | None = None,
    plot_every: float = PLOT_EVERY_SECONDS,
    defaults: Mapping[str, Any] | None = None,
) -> list[dict]:
    """Train every group not yet in out/results.jsonl, in order; after each, append its records (with the
    sweep's metadata) and call write(out, records). Returns all records.

    plot(records) draws every figure from the records so far: after a group when the last drawing is at
    least plot_every seconds old (so a long sweep's figures stay current while short groups do not
    spend their time drawing), and at the end unless the last group was just drawn, which also redraws a
    resumed folder with this code. defaults: the config fields' defaults, by which a folder written before a
    field was added still resumes (`same_sweep`).
    """
    records, meta = open_sweep(out, config, control, defaults)
    plot = plot if jax.process_index() == 0 else None  # figures are files: process 0 draws them
    last_plot, drawn = time.monotonic(), None
    for k, spec in enumerate(groups, 1):
        if spec.done_in(records):
            log(f"{spec.name}: already in {out / 'results.jsonl'}, skipped")
            continue
        log(f"group {k} of {len(groups)}: {spec.name}, {spec.runs} runs")
        checkpoints = group_checkpoints(out, spec.name, {"config": config, "batch": spec.name}, control)
        trained = spec.train(checkpoints, control.resume)
        records += [{**r, **meta} for r in trained]
        write(out, records)
        remove_tree(checkpoints.directory)
        if plot is not None and time.monotonic() - last_plot >= plot_every:
            plot(records)
            last_plot, drawn = time.monotonic(), len(records)
    if plot is not None and records and drawn != len(records):
        plot(records)
    remove_tree(out / "checkpoints")
    return records


def check_group_names(groups: Sequence[Group]) -> None:
    """Refuse two groups whose names print alike: they would share a checkpoint folder and a maps file."""
    seen: dict[str, Group] = {}
    for group in groups:
        other = seen.setdefault(group.name, group)
        if other is not group:
            raise ConfigError(
                f"groups {other.fields} and {group.fields} would both be named {group.name!r} (their checkpoints "
                "and maps would collide); rename one, or give the values more digits"
            )


@dataclasses.dataclass(frozen=True)
class Result:
    """What `run` leaves: the folder, every record, the reference records and the printed table."""

    out: Path
    records: list[dict]
    reference: list[dict]
    table: str


def jsonable(value: Any) -> Any:
    """A scope or config value as config.json holds it (paths as strings, tuples as lists)."""
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, (tuple, list)):
        return [jsonable(v) for v in value]
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    return value


def sweep_record(study: Study, plan: Plan, method_names: Sequence[str]) -> dict:
    """config.json (less its environment): the study, methods and seeds, then its recorded scope, the config
    and the study's derived values, each nested under its own key so that no name shadows another (the
    Boolean study's derived `steps` per task beside the config's `steps`). Two runs continue each other
    only when these are equal."""
    scope = {
        f.name: jsonable(getattr(plan.scope, f.name))
        for f in dataclasses.fields(plan.scope)
        if f.metadata.get("record", True)
    }
    return {
        "study": study.name,
        "methods": list(method_names),
        "seeds": list(plan.seeds),
        "scope": scope,
        "config": jsonable(dataclasses.asdict(plan.config)),
        "derived": study.describe(plan),
    }


def flat_sweep_record(sweep: dict) -> dict:
    """The flat form config.json had before it was nested (scope, config and derived values merged, later
    keys winning), which older folders hold: a resume of such a folder compares against it."""
    return {
        "study": sweep["study"],
        **sweep["scope"],
        "methods": sweep["methods"],
        "seeds": sweep["seeds"],
        **sweep["config"],
        **sweep["derived"],
    }


def draw(study: Study, plan: Plan, records: list[dict], reference: list[dict], maps: Callable) -> None:
    """The study's figures, as one `drawing.batch`: on the drawing children, side by side, where a CLI
    started them."""
    with drawing.batch():
        study.plot(plan, records, reference, maps)


def run(
    study: Study,
    config: Any,
    out: Path | str,
    *,
    scope: Any = None,
    methods: Sequence[str] | None = None,
    seeds: Sequence[int] | None = None,
    control: RunControl = RunControl(),
    log: Log = progress,
) -> Result:
    """Run a study's sweep into `out`: the path every CLI takes, callable from a notebook.

    config: a config or a preset's name; scope, methods, seeds: the study's defaults when None. Everything
    that can be refused is refused before data is read or a run trained."""
    if isinstance(config, str):
        config = study.preset(config)
    scope = study.scope_type() if scope is None else scope
    overrides.check(config)
    overrides.check(scope)
    names = list(study.default_methods if methods is None else methods)
    seeds = tuple(range(study.default_seeds) if seeds is None else seeds)
    if not seeds_ok(seeds):
        raise ConfigError(f"{SEEDS_EXPECTED}, got {list(seeds)}")
    out = store.ensure_writable_dir(Path(out))
    data, resolved = study.resolve(config, scope, names, log)
    plan = Plan(config, scope, tuple(resolved), seeds, data, out)
    reference = study.reference(plan)

    def maps(fields: Mapping[str, Any]) -> dict | None:
        path = out / "maps" / f"{group_name(fields)}.npz"
        return store.read_maps(path) if path.exists() else None

    def write(out: Path, records: list[dict]) -> str:
        store.write_jsonl(out / "results.jsonl", records)
        body, table = study.summary(plan, records, reference)
        store.write_atomic(out / "summary.md", f"# {study.title}\n\n{body}")
        return table

    def spec(group: Group) -> GroupSpec:
        def train(checkpoints: SweepCheckpoints, resume: bool) -> list[dict]:
            records, arrays = study.run(plan.config, group.spec, plan.seeds, log, checkpoints, resume, group.label)
            if arrays:
                store.write_maps(out / "maps" / f"{group.name}.npz", arrays)
            return records

        return GroupSpec(group.name, group.fields, len(seeds), train)

    groups = study.groups(plan)
    check_group_names(groups)
    records = run_sweep(
        out,
        sweep_record(study, plan, names),
        [spec(g) for g in groups],
        write,
        control,
        log,
        lambda records: draw(study, plan, records, reference, maps),
        defaults=field_defaults(config),
    )
    return Result(out, records, reference, write(out, records))
