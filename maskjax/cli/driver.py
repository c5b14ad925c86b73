"""What every experiment CLI shares: one-line errors, seed parsing, output folders, progress."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Collection, Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np

from maskjax import overrides, runtime, store
from maskjax.errors import ConfigError
from maskjax.methods import methods_for
from maskjax.runner import SEEDS_EXPECTED, RunControl, progress, run, seeds_ok
from maskjax.study import Study


class UserError(ConfigError):
    """Bad input from the command line: reported in one line, exit code 2."""


CHECKOUT_PROG = "python -m experiments."


class Parser(argparse.ArgumentParser):
    """argparse that reports a bad flag in one line instead of a usage block. Every CLI built on it takes
    the runtime flags (--cpu-devices, --compile-cache), applied as soon as the command line is parsed,
    before JAX starts its backends (`maskjax.runtime`). Started as the `maskjax` console script, a program
    names itself `maskjax NAME` in its usage, not the checkout's `python -m experiments.NAME`."""

    def __init__(
        self,
        *args: Any,
        xla_flags: Sequence[str] | Callable[[argparse.Namespace], Sequence[str]] = (),
        **kwargs: Any,
    ) -> None:
        self.xla_flags = xla_flags
        prog = kwargs.get("prog") or ""
        if prog.startswith(CHECKOUT_PROG) and Path(sys.argv[0]).name == "maskjax":
            kwargs["prog"] = "maskjax " + prog.removeprefix(CHECKOUT_PROG)
        super().__init__(*args, **kwargs)
        group = self.add_argument_group("runtime")
        group.add_argument(
            "--cpu-devices",
            type=positive_int,
            help="XLA devices on a CPU, over which the runs are sharded (default: one per core, at most "
            f"{runtime.MAX_DEFAULT_CPU_DEVICES}; env MASKJAX_CPU_DEVICES; 1 turns it off)",
        )
        group.add_argument(
            "--compile-cache",
            help=f"folder of JAX's persistent compilation cache, or 'off' (default {runtime.default_cache_dir()}; "
            "env MASKJAX_COMPILE_CACHE)",
        )
        group.add_argument(
            "--xla-flags",
            choices=(runtime.STUDY, runtime.OFF),
            help="apply the study's own XLA CPU flags, chosen by benchmarks.xla_flags, or none (default study; "
            "env MASKJAX_XLA_FLAGS; a flag the user's XLA_FLAGS sets is left alone)",
        )

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> tuple[argparse.Namespace, list[str]]:
        parsed, rest = super().parse_known_args(args, namespace)
        flags = self.xla_flags(parsed) if callable(self.xla_flags) else self.xla_flags
        runtime.configure(parsed.cpu_devices, parsed.compile_cache, flags, parsed.xla_flags)
        return parsed, rest

    def error(self, message: str) -> None:
        raise UserError(message)


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def seed_list(text: str) -> list[int]:
    """--seeds: a count N (seeds 0..N-1), a comma list (3,5,9) or a range START:STOP (8:16 is 8..15)."""
    try:
        if ":" in text:
            start, stop = (int(t) for t in text.split(":"))
            seeds = list(range(start, stop))
        elif "," in text:
            seeds = [int(t) for t in text.split(",") if t.strip()]
        else:
            seeds = list(range(int(text)))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a count N, a list 3,5,9 or a range 8:16, got {text!r}") from None
    if not seeds_ok(seeds):
        raise argparse.ArgumentTypeError(f"{SEEDS_EXPECTED}, got {text!r}")
    return seeds


def add_seeds(parser: argparse.ArgumentParser, default: int) -> None:
    parser.add_argument(
        "--seeds",
        type=seed_list,
        default=list(range(default)),
        help=f"a count N (seeds 0..N-1), a list 3,5,9 or a range 8:16 (default {default})",
    )


positive_float = overrides.flag_type(float, {"above": 0}, "positive_float")


def name_list(text: str) -> list[str]:
    names = [t.strip() for t in text.split(",") if t.strip()]
    if not names:
        raise argparse.ArgumentTypeError("expected a comma-separated list of names")
    return names


def float_list(text: str) -> list[float]:
    try:
        values = [float(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None
    if not values or not all(np.isfinite(values)):
        raise argparse.ArgumentTypeError(f"expected finite comma-separated numbers, got {text!r}")
    return values


def fraction_list(include_one: bool) -> Callable[[str], list[float]]:
    """A parser of comma-separated fractions in (0, 1), or (0, 1] when include_one."""

    def parse(text: str) -> list[float]:
        values = float_list(text)
        bad = [v for v in values if not (0.0 < v < 1.0 or (include_one and v == 1.0))]
        if bad:
            raise argparse.ArgumentTypeError(
                f"fractions must lie in (0, 1{']' if include_one else ')'}, got {bad[0]:g}"
            )
        return values

    return parse


DISTRIBUTED_ENV = {
    "coordinator_address": "JAX_COORDINATOR_ADDRESS",
    "num_processes": "JAX_NUM_PROCESSES",
    "process_id": "JAX_PROCESS_ID",
}


def initialize_distributed() -> None:
    """Join a multi-host job when MASKJAX_DISTRIBUTED=1: from JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES /
    JAX_PROCESS_ID where they are set (jax.distributed does not read the last two itself), else as
    jax.distributed finds them on Cloud TPU, Slurm and Open MPI. CPU processes exchange arrays through gloo.
    The runs axis then spans every process's devices; only process 0 writes files."""
    if os.environ.get("MASKJAX_DISTRIBUTED") != "1":
        return
    given = {name: os.environ[var] for name, var in DISTRIBUTED_ENV.items() if os.environ.get(var)}
    try:
        for name in ("num_processes", "process_id"):
            if name in given:
                given[name] = int(given[name])
    except ValueError:
        raise UserError(f"{', '.join(DISTRIBUTED_ENV.values())} must name an address and two integers") from None
    if not os.environ.get("JAX_CPU_COLLECTIVES_IMPLEMENTATION"):
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(**given)


def run_main(main: Callable[[list[str] | None], int], argv: list[str] | None = None) -> int:
    """Run a CLI body; bad input (`ConfigError`) becomes `error: ...` on stderr and exit 2. Any other exception
    is a bug, or the environment failing, and keeps its traceback."""
    try:
        initialize_distributed()
        return main(argv)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted: results written so far are kept", file=sys.stderr)
        return 130


def read_result_folders(dirs: Sequence[Path]) -> list[tuple[Path, list[dict]]]:
    """Each folder with the records of its results.jsonl; a folder without one is bad input."""
    found = []
    for folder in dirs:
        path = folder / "results.jsonl"
        if not path.is_file():
            raise UserError(f"{path} does not exist")
        found.append((folder, store.read_jsonl(path)))
    return found


def source_line(folder: Path, records: Sequence[dict]) -> str:
    """How a merged page names a folder it read: its records and the commits that wrote them."""
    commits = sorted({r.get("git_commit", "?")[:7] for r in records})
    return f"- `{folder}`: {len(records)} records, commit {', '.join(commits)}"


def add_run_control(parser: argparse.ArgumentParser) -> None:
    """Flags every long-running CLI shares: any config field (--set), checkpoints, resume, overwrite."""
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="set any field of the preset's config, checked against its type and recorded in config.json, "
        "e.g. --set model.dim=64 --set min_steps=2000 (repeatable; after the other flags)",
    )
    parser.add_argument(
        "--checkpoint-every", type=positive_int, help="checkpoint every N steps (default: every 5 minutes)"
    )
    parser.add_argument("--resume", action="store_true", help="continue the run in --out from its checkpoints")
    parser.add_argument("--overwrite", action="store_true", help="replace results of a different config in --out")


def run_control(args: argparse.Namespace) -> RunControl:
    """The sweep's folder policy from the flags of `add_run_control`."""
    return RunControl(args.checkpoint_every, args.resume, args.overwrite)


def add_field_flags(
    parser: argparse.ArgumentParser,
    kind: type,
    dest: str,
    title: str,
    exclude: Collection[str] = (),
    defaults: bool = False,
) -> None:
    """One flag per leaf field of a config dataclass (nested ones flattened: model.dim is --dim), each
    setting only what the user gives, so the preset stays the default."""
    group = parser.add_argument_group(title)
    for field in overrides.fields_of(kind):
        if field.path == ("preset",) or field.name in exclude:
            continue
        help_text = field.meta.get("help") or " ".join(field.path).replace("_", " ")
        if defaults:
            default = overrides.get(kind(), field.path)
            shown = ",".join(map(str, default)) if isinstance(default, tuple) else default
            help_text += f" (default {shown})"
        options: dict[str, Any] = {"dest": f"{dest}.{field.name}", "default": argparse.SUPPRESS, "help": help_text}
        choices = overrides.choices_of(field.kind, field.meta)
        if field.kind is bool:
            options["action"] = argparse.BooleanOptionalAction
        elif choices:
            options["choices"] = choices
        else:
            options["type"] = overrides.flag_type(field.kind, field.meta, field.name)
            options["metavar"] = field.path[-1].upper()
        group.add_argument(f"--{field.flag}", **options)


def given(args: argparse.Namespace, dest: str) -> dict[tuple[str, ...], Any]:
    """The field flags the user gave, by field path."""
    return {tuple(k.split(".")[1:]): v for k, v in vars(args).items() if k.startswith(dest + ".")}


def add_config_flags(
    parser: argparse.ArgumentParser, study: Study, exclude: Collection[str] = (), with_run_control: bool = True
) -> None:
    """--seeds, --preset, every config field's flag, the study's own flags and run control: what any tool
    that trains a study's config takes (`main` adds --methods, --out and the scope)."""
    add_seeds(parser, study.default_seeds)
    parser.add_argument(
        "--preset",
        default=study.default_preset,
        help=f"one of {','.join(study.presets)} (default {study.default_preset})",
    )
    add_field_flags(parser, study.config_type, "config", "config (default: the preset's)", exclude)
    study.add_flags(parser)
    if with_run_control:
        add_run_control(parser)


def config_from_args(study: Study, args: argparse.Namespace) -> Any:
    """The preset, then each field flag given, the study's own flags, then each --set (a later one wins)."""
    config = study.preset(args.preset)
    for path, value in given(args, "config").items():
        config = overrides.replace(config, path, value)
    config = study.apply_flags(config, args)
    return overrides.apply(config, getattr(args, "set", []))


def study_parser(study: Study) -> Parser:
    p = Parser(
        prog=f"python -m experiments.{study.name}",
        description=study.description,
        xla_flags=lambda parsed: study.xla_flags(parsed.preset),
    )
    add_field_flags(p, study.scope_type, "scope", "what to run", defaults=True)
    p.add_argument(
        "--methods",
        type=name_list,
        default=list(study.default_methods),
        help=f"comma list of {','.join(methods_for(study.name))} (default {','.join(study.default_methods)})",
    )
    p.add_argument(
        "--out", type=Path, default=Path("results") / study.name, help=f"output folder (default results/{study.name})"
    )
    add_config_flags(p, study)
    return p


def main(study: Study, argv: list[str] | None = None) -> int:
    """Any study as a CLI: parse, `maskjax.runner.run`, print the summary table and where the files are."""
    args = study_parser(study).parse_args(argv)
    scope = study.scope_type(**{path[0]: value for path, value in given(args, "scope").items()})
    result = run(
        study,
        config_from_args(study, args),
        args.out,
        scope=scope,
        methods=args.methods,
        seeds=args.seeds,
        control=run_control(args),
        log=progress,
    )
    print(result.table, end="")
    print(f"results in {result.out}/ (results.jsonl, summary.md, config.json, {study.figures})", file=sys.stderr)
    return 0
