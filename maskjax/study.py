"""What a study is, and the registry of studies by name: the interface the one driver (`maskjax.runner.run`,
`maskjax.cli.driver.main`), `benchmarks.step` and the tests run.

A study declares its config (a frozen dataclass on `maskjax.optim.OptimizerConfig`, whose fields become
flags), its scope (what to run: tasks, ops, a dataset; also a frozen dataclass), presets, default seeds and
methods; and it fills its hooks: make the data every group shares, list the groups of runs, build one group's
`TrainInputs`, turn the trained group into records, write its summary, draw its figures. The driver owns
everything else (flags, the output folder, config.json, training, checkpoints, resume, results files), so a
new study is one module that calls `register` (docs/design.md, "Adding a study").
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar, Generic, Protocol, TypeVar

import numpy as np

from maskjax.errors import ConfigError
from maskjax.methods import Method, check_in_study, get_method
from maskjax.train import Checkpointer, Trained, TrainInputs, train

Log = Callable[[str], None]
Spec = TypeVar("Spec")


def group_name(fields: Mapping[str, Any]) -> str:
    """A group's name from its record fields (floats in their shortest form): it names the group's checkpoints
    folder and maps file, so a study finds a group's maps by the same fields it gave the group."""
    return "_".join(f"{v:g}" if isinstance(v, float) else str(v) for v in fields.values())


@dataclasses.dataclass(frozen=True)
class Group(Generic[Spec]):
    """Runs trained as one vmapped program: one per seed, all with the same record `fields` (e.g. task and
    method), which also name it. `spec` is the study's own typed record of what the group trains (its
    resolved task, training fraction, method, ...): with the config and the seeds, all `Study.build` needs."""

    fields: dict[str, Any]
    spec: Spec

    @property
    def name(self) -> str:
        return group_name(self.fields)

    @property
    def label(self) -> str:
        """How progress lines name the group."""
        return " ".join(f"{v:g}" if isinstance(v, float) else str(v) for v in self.fields.values())


@dataclasses.dataclass(frozen=True)
class Plan:
    """What a sweep was resolved to, handed to every hook once the data is made."""

    config: Any
    scope: Any
    methods: tuple[Method, ...]
    seeds: tuple[int, ...]
    data: Any
    out: Path | None


class Built(Protocol):
    """What `Study.build` returns: the group's training inputs, beside whatever its records need (the model,
    held-out data)."""

    @property
    def inputs(self) -> TrainInputs: ...


Maps = Callable[[Mapping[str, Any]], "dict[str, np.ndarray] | None"]


class Study:
    """The interface; see the module docstring. Class attributes are data, methods are hooks with defaults."""

    name: ClassVar[str]
    title: ClassVar[str]
    description: ClassVar[str] = ""
    config_type: ClassVar[type]
    scope_type: ClassVar[type]
    presets: ClassVar[Mapping[str, Any]]
    default_preset: ClassVar[str] = "quick"
    default_seeds: ClassVar[int] = 4
    default_methods: ClassVar[tuple[str, ...]] = ("vanilla", "mask")
    figures: ClassVar[str] = "*.png"
    # The scope `benchmarks.step` times (its first group for the method asked), on `sample_data`.
    benchmark_scope: ClassVar[Any] = None
    # Per preset, the XLA flags that make the study's step fastest on a CPU, chosen by `benchmarks.xla_flags`
    # (docs/performance.md: a flag that speeds a small step can slow a larger one); the CLI adds them to
    # XLA_FLAGS before JAX compiles (`maskjax.runtime`), and the records name them.
    cpu_xla_flags: ClassVar[Mapping[str, tuple[str, ...]]] = {}

    def xla_flags(self, preset: str) -> tuple[str, ...]:
        """The XLA CPU flags measured fastest for a preset's step (none for a preset not measured)."""
        return tuple(self.cpu_xla_flags.get(preset, ()))

    def preset(self, name: str) -> Any:
        """A preset's config by name."""
        if name not in self.presets:
            raise ConfigError(f"unknown preset {name!r}; known: {', '.join(self.presets)}")
        return self.presets[name]

    def add_flags(self, parser: argparse.ArgumentParser) -> None:
        """Flags that are not a config field (the Boolean study's one --learning-rate for every task)."""

    def apply_flags(self, config: Any, args: argparse.Namespace) -> Any:
        """The config with the flags of `add_flags` applied."""
        return config

    def check(self, config: Any, scope: Any) -> None:
        """Refuse what cannot be built, before any data is read or any run trained."""

    def resolve_methods(self, names: Sequence[str], config: Any, scope: Any) -> list[Method]:
        """Methods by name from the registry, each one defined for this study and buildable in this scope."""
        methods = [get_method(name) for name in names]
        for method in methods:
            check_in_study(method, self.name)
            self.check_method(method, config, scope)
        return methods

    def check_method(self, method: Method, config: Any, scope: Any) -> None:
        """Refuse a method whose prior this scope cannot build (a mask pattern a task does not have), naming the
        method."""

    def resolve(self, config: Any, scope: Any, names: Sequence[str], log: Log) -> tuple[Any, list[Method]]:
        """(the data, the methods): the config and scope checked, the methods resolved, then the data made, in
        that order, so that bad input is refused before any data is read."""
        self.check(config, scope)
        methods = self.resolve_methods(names, config, scope)
        return self.make_data(config, scope, log), methods

    def make_data(self, config: Any, scope: Any, log: Log) -> Any:
        """What every group shares (a dataset, tokenized corpus, the resolved tasks); None by default."""
        return None

    def sample_data(self, config: Any, scope: Any) -> Any:
        """Data of the real shapes for `benchmarks.step` (a step's cost does not depend on its values): the
        study's own data by default; a study that reads files gives random arrays of their shapes."""
        return self.make_data(config, scope, lambda message: None)

    def groups(self, plan: Plan) -> list[Group]:
        raise NotImplementedError

    def build(self, config: Any, spec: Any, seeds: Sequence[int]) -> Built:
        """One group's training inputs (and what its records need), for these seeds."""
        raise NotImplementedError

    def record(
        self, config: Any, spec: Any, seeds: Sequence[int], built: Any, trained: Trained, started: float
    ) -> tuple[list[dict], dict[str, np.ndarray]]:
        """The trained group's records, one per seed, and the small arrays its figures need (none: no maps
        file); started: when training began (time.time()), for the records' batch_seconds."""
        raise NotImplementedError

    def run(
        self,
        config: Any,
        spec: Any,
        seeds: Sequence[int],
        log: Log | None = None,
        checkpoints: Checkpointer | None = None,
        resume: bool = False,
        label: str = "",
    ) -> tuple[list[dict], dict[str, np.ndarray]]:
        """Build, train and record one group: what the driver runs for each group, callable on its own."""
        built = self.build(config, spec, seeds)
        started = time.time()
        trained = train(built.inputs, log, label, checkpoints, resume)
        return self.record(config, spec, seeds, built, trained, started)

    def describe(self, plan: Plan) -> dict:
        """config.json keys beyond the config and scope (the Boolean study's steps per task)."""
        return {}

    def reference(self, plan: Plan) -> list[dict]:
        """Records shown beside the runs, not trained (the Boolean study's minimum-degree interpolator)."""
        return []

    def summary(self, plan: Plan, records: list[dict], reference: list[dict]) -> tuple[str, str]:
        """(summary.md's body, the table the CLI prints)."""
        raise NotImplementedError

    def plot(self, plan: Plan, records: list[dict], reference: list[dict], maps: Maps) -> None:
        """Every figure from the records so far; maps(fields) reads the arrays of the group with those record
        fields, or gives None."""


STUDIES: dict[str, Study] = {}
# The studies this package ships, each registered when its module (maskjax.studies.NAME) is imported.
BUILT_IN = ("boolean", "arithmetic", "vision", "language")

StudyType = TypeVar("StudyType", bound=Study)


def register(study: StudyType) -> StudyType:
    """Add a study to the registry under its name: the CLI, the method registry, `benchmarks.step` and the
    tests find it there."""
    if study.name in STUDIES and type(STUDIES[study.name]) is not type(study):
        raise ConfigError(f"study {study.name!r} is already registered")
    STUDIES[study.name] = study
    return study


def get_study(name: str) -> Study:
    """A registered study by name; a built-in one is imported on first use."""
    if name not in STUDIES and name in BUILT_IN:
        importlib.import_module(f"maskjax.studies.{name}")
    if name not in STUDIES:
        raise ConfigError(f"unknown study {name!r}; known: {', '.join(study_names())}")
    return STUDIES[name]


def study_names() -> list[str]:
    """The built-in studies, then any other registered, in registration order."""
    return [*BUILT_IN, *(name for name in STUDIES if name not in BUILT_IN)]
