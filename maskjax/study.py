"""What a study is: the interface the one driver (`maskjax.runner.run`, `experiments.cli.main`) runs.

A study declares its config (a frozen dataclass whose fields become flags), its scope (what to run: tasks,
ops, a dataset; also a frozen dataclass), presets, default seeds and methods; and it fills five hooks: make
the data every group shares, list the groups of runs, train one group, write its summary, draw its
figures. The driver owns everything else (flags, the output folder, config.json, checkpoints, resume,
results files), so a new study is one module and a six-line CLI alias (docs/design.md, "Adding a study").
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from maskjax.checkpoint import SweepCheckpoints
from maskjax.methods import Method, check_in_study, get_method

Log = Callable[[str], None]
Maps = Callable[[str], "dict[str, np.ndarray] | None"]


@dataclasses.dataclass(frozen=True)
class Group:
    """Runs trained as one vmapped program: one per seed, all with the same record `fields` (e.g. task and
    method), which also name its checkpoints and maps file. `items` are the study's own objects for it."""

    fields: dict[str, Any]
    items: tuple = ()

    @property
    def name(self) -> str:
        return "_".join(f"{v:g}" if isinstance(v, float) else str(v) for v in self.fields.values())


@dataclasses.dataclass(frozen=True)
class Plan:
    """What a sweep was resolved to, handed to every hook once the data is made."""

    config: Any
    scope: Any
    methods: tuple[Method, ...]
    seeds: tuple[int, ...]
    data: Any
    out: Path


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

    def add_flags(self, parser: argparse.ArgumentParser) -> None:
        """Flags that are not a config field (the Boolean study's one --learning-rate for every task)."""

    def apply_flags(self, config: Any, args: argparse.Namespace) -> Any:
        """The config with the flags of `add_flags` applied."""
        return config

    def check(self, config: Any, scope: Any) -> None:
        """Refuse what cannot be built, before any data is read or any run trained."""

    def resolve_methods(self, names: Sequence[str], config: Any, scope: Any) -> list[Method]:
        """Methods by name from the registry, each one defined for this study."""
        methods = [get_method(name) for name in names]
        for method in methods:
            check_in_study(method, self.name)
        return methods

    def make_data(self, config: Any, scope: Any, log: Log) -> Any:
        """What every group shares (a dataset, tokenized corpus, the resolved tasks); None by default."""
        return None

    def groups(self, plan: Plan) -> list[Group]:
        raise NotImplementedError

    def describe(self, plan: Plan) -> dict:
        """config.json keys beyond the config and scope (the Boolean study's steps per task)."""
        return {}

    def reference(self, plan: Plan) -> list[dict]:
        """Records shown beside the runs, not trained (the Boolean study's minimum-degree interpolator)."""
        return []

    def train(
        self, plan: Plan, group: Group, log: Log, checkpoints: SweepCheckpoints | None, resume: bool
    ) -> tuple[list[dict], dict[str, np.ndarray]]:
        """Train one group; its records and the small arrays its figures need (none: no maps file)."""
        raise NotImplementedError

    def summary(self, plan: Plan, records: list[dict], reference: list[dict]) -> tuple[str, str]:
        """(summary.md's body, the table the CLI prints)."""
        raise NotImplementedError

    def plot(self, plan: Plan, records: list[dict], reference: list[dict], maps: Maps) -> None:
        """Every figure from the records so far; maps(group name) reads a group's arrays or gives None."""
