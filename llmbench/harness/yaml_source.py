"""Strict YAML for people: plain data with the line of every key path, and each mistake as
`file:line: key.path: reason` (run specs and gates files read through here).

Plain data only, and bounded before anything is built: YAML anchors and aliases are refused (nine
nested aliases of nine items each expand to 9^9 values, an "alias bomb"; a spec needs none), so
are texts over `MAX_BYTES` and nesting deeper than `MAX_DEPTH`; tags other than YAML's own
(`!!python/...`) are a mistake with a line like any other.
"""

from __future__ import annotations

from typing import Any

import yaml

from llmbench.errors import UserError

MAX_BYTES = 1 << 20  # a spec is a few KB; an empirical list of 100,000 lengths still fits
MAX_DEPTH = 32  # sections and lists inside each other: a spec has 4

# libyaml's parser where PyYAML was built with it (about 20x faster), else PyYAML's own.
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_SCALARS = yaml.constructor.SafeConstructor()


class SpecError(UserError):
    """A mistake at `path`, a dotted key path such as `load.rate_per_s`; its line comes later."""

    def __init__(self, path: str, reason: str):
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


def read_yaml(text: str, source: str) -> tuple[Any, dict[str, int]]:
    """The document as plain Python (None when empty) and the line of every key path in it;
    anything but plain data (`check_plain`) is one line naming `source` and its line."""
    check_plain(text, source)
    try:
        root = yaml.compose(text, Loader=_LOADER) if text.strip() else None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{source}:{mark.line + 1}" if mark else source
        raise UserError(f"{where}: not valid YAML ({getattr(e, 'problem', e)})") from None
    lines: dict[str, int] = {}
    try:
        data = _plain(root, "", lines) if root is not None else None
    except SpecError as e:
        raise located(e, source, lines) from None
    return data, lines


def check_plain(text: str, source: str, *, has_lines: bool = True) -> None:
    """Refuse, in one `UserError` line naming `source` (and the line, with `has_lines`), a YAML
    text that is more than plain data, before any of it is built: over `MAX_BYTES`, an anchor
    or alias, nesting deeper than `MAX_DEPTH`. Malformed YAML is left to the reader's message."""
    if len(text) > MAX_BYTES:
        raise UserError(
            f"{source}: {len(text):,} characters, over the {MAX_BYTES:,} llmbench reads; a spec "
            "is a few KB"
        )
    depth = 0
    try:
        for event in yaml.parse(text, Loader=_LOADER):
            where = f"{source}:{event.start_mark.line + 1}" if has_lines else source
            if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None):
                mark = "alias *" if isinstance(event, yaml.AliasEvent) else "anchor &"
                raise UserError(
                    f"{where}: YAML {mark}{event.anchor}: not read (an alias can expand without "
                    "bound); write the value out"
                )
            if isinstance(event, yaml.CollectionStartEvent):
                depth += 1
                if depth > MAX_DEPTH:
                    raise UserError(f"{where}: nested deeper than {MAX_DEPTH} levels")
            elif isinstance(event, yaml.CollectionEndEvent):
                depth -= 1
    except yaml.YAMLError:
        return  # malformed: the reader says where and why


def located(error: SpecError, source: str, lines: dict[str, int]) -> UserError:
    """`error` as the one line a person reads: `source:line: key.path: reason`."""
    line = _line_for(error.path, lines)
    where = f"{source}:{line}" if line else source
    return UserError(f"{where}: {error.path}: {error.reason}")


def _plain(node: yaml.Node, path: str, lines: dict[str, int]) -> Any:
    """YAML node → plain Python, remembering the line of every key path."""
    lines[path] = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        out = {}
        for key_node, value_node in node.value:
            key = str(key_node.value)
            sub = f"{path}.{key}" if path else key
            if key in out:
                lines[sub] = key_node.start_mark.line + 1
                raise SpecError(sub, "duplicate key")
            out[key] = _plain(value_node, sub, lines)
            lines[sub] = key_node.start_mark.line + 1  # errors point at the key, not its value
        return out
    if isinstance(node, yaml.SequenceNode):
        return [_plain(v, f"{path}[{i}]", lines) for i, v in enumerate(node.value)]
    try:
        return _SCALARS.construct_document(node)
    except yaml.YAMLError as e:  # a tag YAML's safe schema does not know: !!python/name:...
        raise SpecError(path or "(top level)", f"not a plain YAML value ({e.problem})") from None


def _line_for(path: str, lines: dict[str, int]) -> int:
    while path:
        if path in lines:
            return lines[path]
        path = path.rpartition(".")[0]
    return 0
