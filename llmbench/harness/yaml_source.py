"""Strict YAML for people: plain data with the line of every key path, and each mistake as
`file:line: key.path: reason` (run specs and gates files read through here)."""

from __future__ import annotations

from typing import Any

import yaml

from llmbench.errors import UserError


class SpecError(UserError):
    """A mistake at `path`, a dotted key path such as `load.rate_per_s`; its line comes later."""

    def __init__(self, path: str, reason: str):
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


def read_yaml(text: str, source: str) -> tuple[Any, dict[str, int]]:
    """The document as plain Python (None when empty) and the line of every key path in it."""
    try:
        root = yaml.compose(text) if text.strip() else None
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
    return yaml.safe_load(yaml.serialize(node))


def _line_for(path: str, lines: dict[str, int]) -> int:
    while path:
        if path in lines:
            return lines[path]
        path = path.rpartition(".")[0]
    return 0
