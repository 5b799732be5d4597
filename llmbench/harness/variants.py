"""Variants: one run spec measured once per configuration, to compare them side by side.

A spec's `variants:` list (`- {name: int8, set: {engine.quantize: int8}}`) or the `--vary
engine.quantize=none,int8,int4` option says what each configuration changes, with the dotted keys
and the values `--set` takes (set over the spec as written and its `--set` overrides; a variant
without `set` is the spec as written). Every variant's spec is built and checked here, before
anything runs: a problem is one line naming `variants[i].set.<key>` (or the `--vary` option).
A variant that sets a kind (`--vary load.kind=concurrency,poisson`) drops the old kind's keys
as `--set` does, with the same note (once per key and value).
"""

from __future__ import annotations

import copy
import itertools
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmbench.errors import UserError
from llmbench.harness.spec import RunSpec
from llmbench.harness.spec_load import (
    build_spec,
    override_value,
    owner,
    print_note,
    read_spec_data,
    set_override,
    split_override,
)
from llmbench.harness.yaml_source import SpecError, located

VARIANTS_KEY = "variants"
# A variant's name is its folder's name (`variants/<name>/`), safe on every file system.
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,63}")
NAME_RULE = "1 to 64 letters, digits, '.', '_', '+' or '-', starting with a letter or digit"
NOT_WITH_SWEEP = (
    "not with variants: each variant is one run; drop load.sweep, or sweep each configuration "
    "in its own run"
)
NOT_WITH_SEARCH = (
    "not with variants: each variant is one run; drop load.search, or search each "
    "configuration in its own run"
)


@dataclass(frozen=True)
class Variant:
    """One configuration of a run: its `name` (its folder `variants/<name>/`), the dotted keys
    it sets over the spec (empty: the spec as written) and its checked spec."""

    name: str
    settings: Mapping[str, Any]
    spec: RunSpec


def load_variants(
    path: Path,
    overrides: Sequence[str] = (),
    vary: Sequence[str] = (),
    say: Callable[[str], None] = print_note,
) -> tuple[RunSpec, tuple[Variant, ...]]:
    """The spec at `path` with its `--set` `overrides`, and its variants, none for a plain run:
    the spec's `variants:` list, or the `--vary` options (one variant per value; several
    options: one per combination), never both. `say` gets the notes of kinds switched."""
    source = read_spec_data(path, list(overrides), say)
    data = source.data
    listed = data.pop(VARIANTS_KEY, None)
    try:
        base = build_spec(data)
        if (listed is not None or vary) and base.load.sweep:
            raise SpecError("load.sweep", NOT_WITH_SWEEP)
        if (listed is not None or vary) and base.load.search is not None:
            raise SpecError("load.search", NOT_WITH_SEARCH)
    except SpecError as e:
        raise source.error(e) from None
    if listed is None and not vary:
        return base, ()
    if listed is not None and vary:
        raise UserError(f"--vary: {path} lists variants already; use one or the other")
    notes: dict[str, None] = {}  # each note once, in order: the same switch in many variants

    def note(line: str) -> None:
        if line not in notes:
            notes[line] = None
            say(line)

    if listed is not None:
        try:
            named = listed_settings(listed)
        except SpecError as e:
            raise located(e, str(path), source.lines) from None
        variants = []
        for i, (name, settings) in enumerate(named):

            def blame(key: str | None, e: SpecError, i: int = i) -> UserError:
                at = f"{VARIANTS_KEY}[{i}]" + ("" if key is None else f".set.{key}")
                return located(SpecError(at, _reason(key, e)), str(path), source.lines)

            def told(key: str, text: str, i: int = i, settings=settings) -> None:
                note(f"note: {VARIANTS_KEY}[{i}] sets {key}={_text(settings[key])}: {text}")

            spec = variant_spec(data, settings, blame, told)
            variants.append(Variant(name, settings, spec))
        return base, tuple(variants)
    variants = []
    for name, settings in vary_settings(vary):

        def blame(key: str | None, e: SpecError, name: str = name, settings=settings) -> UserError:
            where = f"{key}={_text(settings[key])}" if key is not None else f"variant {name}"
            return UserError(f"--vary {where}: {_reason(key, e)}")

        def told(key: str, text: str, settings=settings) -> None:
            note(f"note: --vary {key}={_text(settings[key])} {text}")

        variants.append(Variant(name, settings, variant_spec(data, settings, blame, told)))
    return base, tuple(variants)


def listed_settings(items: Any) -> list[tuple[str, dict[str, Any]]]:
    """The spec's `variants:` list as (name, settings) pairs, names checked: each a folder
    name, no two alike."""
    if not isinstance(items, list) or not items:
        raise SpecError(VARIANTS_KEY, "must be a non-empty list of {name, set}")
    out: list[tuple[str, dict[str, Any]]] = []
    for i, item in enumerate(items):
        at = f"{VARIANTS_KEY}[{i}]"
        if not isinstance(item, dict):
            raise SpecError(at, f"must be a mapping {{name, set}}, got {type(item).__name__}")
        for key in item:
            if key not in ("name", "set"):
                raise SpecError(f"{at}.{key}", "unknown key; known keys here: name, set")
        name = item.get("name")
        if not isinstance(name, str) or not NAME.fullmatch(name):
            raise SpecError(f"{at}.name", f"must be {NAME_RULE}, got {name!r}")
        for j, (other, _) in enumerate(out):
            if other == name:
                raise SpecError(f"{at}.name", f"'{name}' names {VARIANTS_KEY}[{j}] already")
        settings = item.get("set") or {}
        if not isinstance(settings, dict):
            raise SpecError(f"{at}.set", f"must be a mapping of key.path: value, got {settings!r}")
        out.append((name, settings))
    return out


def vary_settings(options: Sequence[str]) -> list[tuple[str, dict[str, Any]]]:
    """`--vary key.path=v1,v2,...` options as variants: (name, settings). One option: a variant
    per value, named by it (`int4:64` → `int4-64`); several: a variant
    per combination, the names joined by `_`, the first option's values outermost."""
    axes = []
    keys: set[str] = set()
    for option in options:
        key, raw = split_override(option, "--vary", "key.path=value,value,...")
        if key in keys:
            raise UserError(f"--vary {option}: {key} is varied twice; give its values once")
        keys.add(key)
        texts = split_values(raw)
        names = [folder_name(text) for text in texts]
        for text, name in zip(texts, names, strict=True):
            if not text:
                raise UserError(f"--vary {option}: an empty value; separate values with one comma")
            if not name:
                raise UserError(f"--vary {option}: value {text!r} makes no folder name")
        if len(set(names)) < len(names):
            raise UserError(f"--vary {option}: two values make the same folder name")
        values = [override_value(text, f"--vary {option}") for text in texts]
        axes.append([(name, key, value) for name, value in zip(names, values, strict=True)])
    out = []
    for combination in itertools.product(*axes):
        name = "_".join(name for name, _, _ in combination)[:64]
        out.append((name, {key: value for _, key, value in combination}))
    if len({name for name, _ in out}) < len(out):
        raise UserError("--vary: two combinations make the same folder name; vary fewer keys")
    return out


def split_values(raw: str) -> list[str]:
    """`v1,v2,...` split at its top-level commas: a comma inside brackets, braces or quotes
    belongs to its value (`{k: int8, v: int4},int8` is two values)."""
    values, depth, quote, start = [], 0, None, 0
    for i, char in enumerate(raw):
        if quote is not None:
            quote = None if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char in "[{":
            depth += 1
        elif char in "]}":
            depth -= 1
        elif char == "," and depth == 0:
            values.append(raw[start:i])
            start = i + 1
    values.append(raw[start:])
    return [value.strip() for value in values]


def folder_name(text: str) -> str:
    """A value as a variant's folder name: every run of other characters than letters, digits,
    `.`, `_`, `+` and `-` becomes one `-` (`int4:64` → `int4-64`, `{k: int8, v: int4}` →
    `k-int8-v-int4`); at most 64 characters."""
    return re.sub(r"[^A-Za-z0-9._+-]+", "-", text).strip("-._+")[:64]


def variant_spec(
    data: dict[str, Any],
    settings: Mapping[str, Any],
    blame: Callable[[str | None, SpecError], UserError],
    told: Callable[[str, str], None] = lambda key, text: None,
) -> RunSpec:
    """The spec `data` with `settings` set, checked; a problem goes to `blame` with the set key
    it comes from (None: from the spec as written, made impossible by the settings); a set kind
    that drops keys goes to `told` with what it dropped (`drops load.rate_per_s (...)`)."""
    resolved = copy.deepcopy(data)
    try:
        for key, value in settings.items():
            switch = set_override(resolved, key, copy.deepcopy(value))
            if switch is not None:
                told(key, switch.text)
        spec = build_spec(resolved)
        if spec.load.sweep:
            raise SpecError("load.sweep", NOT_WITH_SWEEP)
        if spec.load.search is not None:
            raise SpecError("load.search", NOT_WITH_SEARCH)
    except SpecError as e:
        raise blame(owner(e.path, list(settings)), e) from None
    return spec


def _reason(key: str | None, e: SpecError) -> str:
    return e.reason if key == e.path else f"{e.path}: {e.reason}"


def describe(settings: Mapping[str, Any]) -> str:
    """What a variant sets, in one line: `engine.quantize=int8, engine.kv_cache_dtype={"k":
    "int8", "v": "int4"}`; `the spec as written` when nothing."""
    if not settings:
        return "the spec as written"
    return ", ".join(f"{key}={_text(value)}" for key, value in settings.items())


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, default=str)
