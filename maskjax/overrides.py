"""A study config's fields, set from text: `--set NAME=VALUE` and the flags generated from the dataclass.

`apply(config, ["model.dim=64", "learning_rate=3e-4"])` returns a new config; a dotted name reaches into a
nested dataclass. Both routes read a value with one converter (`convert`), against the field's type and the
bounds its `option(...)` metadata gives, so `--learning-rate=0`, `--set learning_rate=0` and a config built
in Python (`check`) are refused alike. A name that is not a field, or a value that does not fit, is a
`ConfigError` that says what is wrong, so a typo never silently trains the preset.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import types
import typing
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from maskjax.errors import ConfigError

_TRUE, _FALSE = ("true", "1", "yes"), ("false", "0", "no")


def option(
    default: Any = dataclasses.MISSING,
    *,
    help: str = "",
    flag: str | None = None,
    minimum: float | None = None,
    above: float | None = None,
    below: float | None = None,
    maximum: float | None = None,
    choices: Sequence[str] | None = None,
    record: bool = True,
) -> Any:
    """A config field with what its flag needs: help, a flag name other than the field's, bounds (ints are
    >= 1 unless `minimum` says otherwise), a closed list of values, and whether config.json records it."""
    meta = {"help": help, "flag": flag, "minimum": minimum, "above": above, "below": below, "maximum": maximum}
    meta.update(choices=tuple(choices) if choices is not None else None, record=record)
    if isinstance(default, (list, dict, set)):
        raise TypeError("use a tuple for a sequence default")
    return dataclasses.field(default=default, metadata=meta)


def with_default(kind: type, name: str, default: Any) -> Any:
    """The field `name` of the dataclass `kind` (help, flag and bounds) with another default: how a subclass (a
    study's config on `maskjax.optim.OptimizerConfig`) changes a shared field's default."""
    if isinstance(default, (list, dict, set)):
        raise TypeError("use a tuple for a sequence default")
    return dataclasses.field(default=default, metadata=kind.__dataclass_fields__[name].metadata)


@dataclasses.dataclass(frozen=True)
class Field:
    """One settable field: its dotted path, type and option metadata."""

    path: tuple[str, ...]
    kind: Any
    meta: typing.Mapping[str, Any]

    @property
    def name(self) -> str:
        return ".".join(self.path)

    @property
    def flag(self) -> str:
        return self.meta.get("flag") or self.path[-1].replace("_", "-")


class BadValue(ValueError):
    """What a value should have been ("a positive integer"), for the caller to name the field or flag."""

    def __init__(self, expected: str, text: object) -> None:
        super().__init__(f"expected {expected}, got {str(text)!r}")
        self.expected, self.text = expected, text


def _bounds(value: float, meta: typing.Mapping[str, Any], integer: bool, text: str) -> None:
    lo, above, below, hi = (meta.get(k) for k in ("minimum", "above", "below", "maximum"))
    if integer and lo is None and above is None:
        lo = 1
    words = []
    if above is not None:
        words.append(f"> {above:g}")
    if lo is not None:
        words.append(f">= {lo:g}")
    if below is not None:
        words.append(f"< {below:g}")
    if hi is not None:
        words.append(f"<= {hi:g}")
    bad = (
        (above is not None and not value > above)
        or (lo is not None and not value >= lo)
        or (below is not None and not value < below)
        or (hi is not None and not value <= hi)
    )
    if bad:
        if not integer and above is not None and lo is None and (below is None) != (hi is None):
            end = f"{below:g})" if hi is None else f"{hi:g}]"
            raise BadValue(f"a number in ({above:g}, {end}", text)
        if integer:
            what = "a positive integer" if words == [">= 1"] else f"an integer {' and '.join(words)}"
        else:
            what = f"a finite number {' and '.join(words)}"
        raise BadValue(what, text)


def choices_of(kind: Any, meta: typing.Mapping[str, Any]) -> tuple | None:
    """The closed list of values a field takes: a Literal's, or its option's `choices`; None for any."""
    return typing.get_args(kind) if typing.get_origin(kind) is typing.Literal else meta.get("choices")


def convert(text: str, kind: Any, meta: typing.Mapping[str, Any] = types.MappingProxyType({})) -> Any:
    """`text` as a value of `kind` (int, float, str, bool, Path, a Literal, a tuple of one of these, or any of
    these or None), within `meta`'s bounds and choices (`validate`); BadValue otherwise."""
    origin = typing.get_origin(kind)
    if origin in (typing.Union, types.UnionType):
        if type(None) in typing.get_args(kind) and text.strip().lower() == "none":
            return None
        return convert(text, _optional(kind), meta)
    if origin is tuple:
        items = [t.strip() for t in text.split(",") if t.strip()]
        if not items:
            raise BadValue("a comma-separated list", text)
        return tuple(convert(t, typing.get_args(kind)[0], meta) for t in items)
    if origin is typing.Literal or kind is str:
        value: Any = text
    elif kind is Path:
        value = Path(text)
    elif kind is bool:
        if text.lower() not in _TRUE + _FALSE:
            raise BadValue("true or false", text)
        value = text.lower() in _TRUE
    elif kind is int:
        try:
            value = int(text)
        except ValueError:
            raise BadValue("an integer", text) from None
    elif kind is float:
        try:
            value = float(text)
        except ValueError:
            raise BadValue("a number", text) from None
    else:
        raise BadValue(f"a value of type {kind}, which cannot be set from text", text)
    validate(value, kind, meta, text)
    return value


def _optional(kind: Any) -> Any:
    """X of `X | None`; a union of two or more types has no text form."""
    options = [o for o in typing.get_args(kind) if o is not type(None)]
    if len(options) != 1:
        raise BadValue(" or ".join(map(str, options)), kind)
    return options[0]


def validate(value: Any, kind: Any, meta: typing.Mapping[str, Any], text: str) -> None:
    """Refuse a value of `kind` outside its choices or bounds (floats must be finite); `text` is how the
    message shows it. The one test behind `convert` (values from text) and `check` (values from Python)."""
    origin = typing.get_origin(kind)
    if value is None and origin in (typing.Union, types.UnionType):
        return
    if origin in (typing.Union, types.UnionType):
        return validate(value, _optional(kind), meta, text)
    if origin is tuple:
        for v in value:
            validate(v, typing.get_args(kind)[0], meta, repr(v))
        return
    choices = choices_of(kind, meta)
    if choices is not None and value not in choices:
        raise BadValue(f"one of {', '.join(map(str, choices))}", text)
    if kind is float and not math.isfinite(value):
        raise BadValue("a finite number", text)
    if kind in (int, float):
        _bounds(value, meta, integer=kind is int, text=text)


def flag_type(kind: Any, meta: typing.Mapping[str, Any] = types.MappingProxyType({}), name: str = "value"):
    """`convert` as an argparse type: a bad value is argparse's one-line error naming the flag."""

    def parse(text: str) -> Any:
        try:
            return convert(text, kind, meta)
        except BadValue as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    parse.__name__ = name
    return parse


def fields_of(config_type: type, prefix: tuple[str, ...] = ()) -> Iterator[Field]:
    """Every leaf field of a config dataclass, nested dataclasses flattened in order; dict fields are left
    out (they are set whole in Python or by the study's own flags)."""
    hints = typing.get_type_hints(config_type)
    for f in dataclasses.fields(config_type):
        kind = hints[f.name]
        if dataclasses.is_dataclass(kind):
            yield from fields_of(kind, (*prefix, f.name))
        elif typing.get_origin(kind) is not dict and kind is not dict:
            yield Field((*prefix, f.name), kind, f.metadata)


def parse_assignment(text: str) -> tuple[list[str], str]:
    name, sep, value = text.partition("=")
    if not sep or not name.strip():
        raise ConfigError(f"expected an override NAME=VALUE (e.g. model.dim=64), got {text!r}")
    return name.strip().split("."), value.strip()


def _set(config: Any, path: list[str], value: str, prefix: str) -> Any:
    hints = typing.get_type_hints(type(config))
    fields = {f.name: f for f in dataclasses.fields(config)}
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
        try:
            new = convert(value, hints[head], fields[head].metadata)
        except BadValue as e:
            raise ConfigError(f"{name} expects {e.expected}, got {value!r}") from None
    return dataclasses.replace(config, **{head: new})


def apply(config: Any, assignments: Sequence[str]) -> Any:
    """`config` with each NAME=VALUE of `assignments` set, in order (a later one wins)."""
    for text in assignments:
        path, value = parse_assignment(text)
        config = _set(config, path, value, "")
    return config


def get(config: Any, path: Sequence[str]) -> Any:
    for name in path:
        config = getattr(config, name)
    return config


def replace(config: Any, path: Sequence[str], value: Any) -> Any:
    """`config` with the field at a dotted path set to `value`."""
    head, *rest = path
    return dataclasses.replace(config, **{head: replace(getattr(config, head), rest, value) if rest else value})


def check(config: Any) -> None:
    """Refuse a config whose fields break their own bounds or choices (one built in Python, or by
    dataclasses.replace): the same test a flag or --set applies to text."""
    for field in fields_of(type(config)):
        value = get(config, field.path)
        try:
            validate(value, field.kind, field.meta, repr(value))
        except BadValue as e:
            raise ConfigError(f"{field.name} expects {e.expected}, got {e.text}") from None
