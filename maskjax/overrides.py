"""Generic `field=value` overrides of a frozen config dataclass, checked against the field's type.

`apply(config, ["model.dim=64", "learning_rate=3e-4"])` returns a new config; a dotted name reaches into a
nested dataclass. A name that is not a field, or a value that does not parse as the field's type, is a
`ConfigError` that names the fields there are, so a typo never silently trains the preset.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Sequence
from typing import Any

from maskjax.errors import ConfigError

_TRUE, _FALSE = ("true", "1", "yes"), ("false", "0", "no")


def parse_assignment(text: str) -> tuple[list[str], str]:
    name, sep, value = text.partition("=")
    if not sep or not name.strip():
        raise ConfigError(f"expected an override NAME=VALUE (e.g. model.dim=64), got {text!r}")
    return name.strip().split("."), value.strip()


def _convert(value: str, kind: Any, name: str) -> Any:
    """`value` as `kind` (int, float, str, bool, a Literal, or any of these or None)."""
    origin = typing.get_origin(kind)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(kind)
        if type(None) in options and value.lower() == "none":
            return None
        errors = []
        for option in (o for o in options if o is not type(None)):
            try:
                return _convert(value, option, name)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(errors[0] if len(errors) == 1 else f"{name}: cannot read {value!r} as {kind}")
    if origin is typing.Literal:
        choices = typing.get_args(kind)
        if value not in choices:
            raise ConfigError(f"{name} must be one of {', '.join(map(str, choices))}, got {value!r}")
        return value
    if kind is bool:
        if value.lower() in _TRUE + _FALSE:
            return value.lower() in _TRUE
        raise ConfigError(f"{name} expects true or false, got {value!r}")
    if kind is int:
        try:
            return int(value)
        except ValueError:
            raise ConfigError(f"{name} expects an integer, got {value!r}") from None
    if kind is float:
        try:
            number = float(value)
        except ValueError:
            raise ConfigError(f"{name} expects a number, got {value!r}") from None
        if not math.isfinite(number):
            raise ConfigError(f"{name} expects a finite number, got {value!r}")
        return number
    if kind is str:
        return value
    raise ConfigError(f"{name} has type {kind}, which cannot be set from the command line")


def _set(config: Any, path: list[str], value: str, prefix: str) -> Any:
    hints = typing.get_type_hints(type(config))
    fields = [f.name for f in dataclasses.fields(config)]
    head, rest = path[0], path[1:]
    name = prefix + head
    if head not in fields:
        raise ConfigError(f"{name} is not a field of {type(config).__name__}; its fields: {', '.join(fields)}")
    current = getattr(config, head)
    if rest:
        if not dataclasses.is_dataclass(current):
            raise ConfigError(f"{name} is not a nested config, so {name}.{'.'.join(rest)} does not exist")
        new = _set(current, rest, value, name + ".")
    elif dataclasses.is_dataclass(current):
        sub = ", ".join(f"{name}.{f.name}" for f in dataclasses.fields(current))
        raise ConfigError(f"{name} is a nested config: set its fields ({sub})")
    else:
        new = _convert(value, hints[head], name)
    return dataclasses.replace(config, **{head: new})


def apply(config: Any, assignments: Sequence[str]) -> Any:
    """`config` with each NAME=VALUE of `assignments` set, in order (a later one wins)."""
    for text in assignments:
        path, value = parse_assignment(text)
        config = _set(config, path, value, "")
    return config
