"""Plain YAML/JSON values → typed frozen dataclasses, strictly: the one converter behind run
specs (`spec_load`) and results files (`results`).

Every key must be a field (`unknown key; known keys here: ...`), every required field present
(`missing`), every value of its annotated type — `bool`, `int` (a bool is not one), `float` (an
int is widened), `str`, `Literal[...]`, `tuple[T, ...]` (from a list), `dict[str, T]`, `X | None`,
nested dataclasses, and `Any` (taken as it is). A union of dataclasses told apart by a literal
`kind` field (the workload kinds, the load modes) is built by `kind` (default: the first), and a
key of another kind is named as such (`not a field of chat workloads (it belongs to rag
workloads)`). A dataclass with an `of_number` class method also accepts a bare number (a spec's
`output_tokens: 64` for a fixed distribution). A mistake raises `SpecError(path, reason)` with the
dotted key path; the caller adds where the data came from (a file and line, a results file).
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from typing import Any, Literal

from llmbench.harness.yaml_source import SpecError


def from_plain(tp: Any, value: Any, path: str = "") -> Any:
    """`value` as `tp` (module docstring), or a `SpecError` naming the key `path` under `path`."""
    origin = typing.get_origin(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        return _union(typing.get_args(tp), value, path)
    if origin is Literal:
        choices = typing.get_args(tp)
        if value not in choices:
            raise SpecError(path, f"must be one of {', '.join(map(str, choices))}, got {value!r}")
        return value
    if origin is tuple:
        if not isinstance(value, list | tuple):
            raise SpecError(path, f"must be a list, got {type(value).__name__}")
        item = typing.get_args(tp)[0]
        return tuple(from_plain(item, v, f"{path}[{i}]") for i, v in enumerate(value))
    if origin in (dict, Mapping):
        if not isinstance(value, dict):
            raise SpecError(path, f"must be a mapping, got {type(value).__name__}")
        item = typing.get_args(tp)[1]
        return {str(k): from_plain(item, v, _join(path, str(k))) for k, v in value.items()}
    if dataclasses.is_dataclass(tp):
        if isinstance(value, int | float) and not isinstance(value, bool):
            if hasattr(tp, "of_number"):
                return tp.of_number(value)
        return _dataclass(tp, value, path)
    return _scalar(tp, value, path)


def _dataclass(cls: type, data: Any, path: str) -> Any:
    if not isinstance(data, dict):
        raise SpecError(path or "(top)", f"must be a mapping, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs = {}
    for key, value in data.items():
        if key not in fields:
            known = ", ".join(sorted(fields))
            raise SpecError(_join(path, key), f"unknown key; known keys here: {known}")
        kwargs[key] = from_plain(hints[key], value, _join(path, key))
    for name, f in fields.items():
        has_default = f.default is not dataclasses.MISSING
        if name not in kwargs and not has_default and f.default_factory is dataclasses.MISSING:
            raise SpecError(_join(path, name), "missing")
    return cls(**kwargs)


def _union(options: tuple[Any, ...], value: Any, path: str) -> Any:
    if value is None and type(None) in options:
        return None
    kinds = _kinds(options)
    if kinds is not None:
        return _by_kind(kinds, value, path)
    errors = []
    for option in options:
        if option is type(None):
            continue
        try:
            return from_plain(option, value, path)
        except SpecError as e:
            errors.append(e)
    if not errors:
        raise SpecError(path, "must not be empty")
    raise errors[0]  # as the first option read it, at the key path it names


def _kinds(options: tuple[Any, ...]) -> dict[str, type] | None:
    """kind value → class, when `options` are dataclasses told apart by a literal `kind` field;
    None for any other union."""
    kinds: dict[str, type] = {}
    for option in options:
        if not dataclasses.is_dataclass(option) or "kind" not in _field_names(option):
            return None
        for kind in typing.get_args(typing.get_type_hints(option)["kind"]):
            kinds[kind] = option
    return kinds


def _by_kind(kinds: dict[str, type], data: Any, path: str) -> Any:
    """The class chosen by `data["kind"]` (default: the first kind), built strictly: a key of
    another kind is named as such (`workload.zipf_s: not a field of chat workloads`)."""
    if not isinstance(data, dict):
        raise SpecError(path, f"must be a mapping, got {type(data).__name__}")
    default = next(iter(kinds.values()))().kind
    kind = data.get("kind", default)
    if kind not in kinds:
        raise SpecError(f"{path}.kind", f"must be one of {', '.join(kinds)}, got {kind!r}")
    cls = kinds[kind]
    noun = path.rpartition(".")[2] + "s"  # "workloads", "loads"
    for key in data:
        if key in _field_names(cls):
            continue
        owners = [k for k, c in kinds.items() if key in _field_names(c)]
        if owners:
            raise SpecError(
                f"{path}.{key}",
                f"not a field of {kind} {noun} (it belongs to {', '.join(owners)} {noun})",
            )
    return _dataclass(cls, data, path)


def _scalar(tp: Any, value: Any, path: str) -> Any:
    if tp is bool:
        if not isinstance(value, bool):
            raise SpecError(path, f"must be true or false, got {value!r:.60}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise SpecError(path, f"must be an integer, got {value!r:.60}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise SpecError(path, f"must be a number, got {value!r:.60}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise SpecError(path, f"must be a string, got {value!r:.60}")
        return value
    raise SpecError(path, f"unsupported type {tp}")


def _field_names(cls: type) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key
