"""The comparisons of a whole `llmbench compare` as one document: a single run's comparison as
`compare_output` renders it, a sweep's point by point (table, Markdown, JUnit XML, JSON).

`points` is a list of (point, comparison): the point names a sweep point ("point-4"), or is
None for the one comparison of two single runs. Pure functions; nothing here writes files.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from typing import Any

from llmbench.compare import output
from llmbench.compare.verdict import Comparison

Points = Sequence[tuple[str | None, Comparison]]
FORMATS = ("table", "markdown", "json")


def _is_single(points: Points) -> bool:
    return len(points) == 1 and points[0][0] is None


def has_regression(points: Points) -> bool:
    return any(comparison.has_regression for _, comparison in points)


def is_unusable(points: Points) -> bool:
    """A point gave no verdict on some gate (refused, no data) and that was not allowed."""
    return any(comparison.is_unusable for _, comparison in points)


def _sweep_title(points: Points) -> str:
    failing = [point for point, c in points if c.has_regression]
    unusable = [point for point, c in points if c.is_unusable]
    if failing:
        verdict = f"REGRESSION at {', '.join(failing)}"
    elif unusable:
        verdict = f"NO VERDICT at {', '.join(unusable)}"
    else:
        verdict = "no regression"
    return f"llmbench compare: sweep of {len(points)} points, {verdict}"


def render_table(points: Points) -> str:
    """The terminal table; a sweep's points one after another under `== point-4 ==`."""
    if _is_single(points):
        return output.render_table(points[0][1])
    parts = [f"{_sweep_title(points)}\n"]
    parts += [f"\n== {point} ==\n{output.render_table(c)}" for point, c in points]
    return "".join(parts)


def render_markdown(points: Points) -> str:
    """GitHub Markdown; a sweep gets a heading, then each point's section titled by its point."""
    if _is_single(points):
        return output.render_markdown(points[0][1])
    parts = [f"## {_sweep_title(points)}\n"]
    for point, comparison in points:
        section = output.render_markdown(comparison)
        prefix = "### llmbench compare"
        if section.startswith(prefix):
            section = f"### {point}" + section[len(prefix) :]
        else:
            section = f"### {point}\n\n{section}"
        parts.append(f"\n{section}")
    return "".join(parts)


def render_junit(points: Points) -> str:
    """JUnit XML: one <testsuite> per sweep point (named "llmbench compare point-4", its test
    cases "point-4: <gate>"), with the totals on <testsuites>."""
    if _is_single(points):
        return output.render_junit(points[0][1])
    root = ET.Element("testsuites", name="llmbench compare")
    totals = dict.fromkeys(("tests", "failures", "errors", "skipped"), 0)
    for point, comparison in points:
        document = ET.fromstring(output.render_junit(comparison))
        for suite in document.iter("testsuite"):
            suite.set("name", f"llmbench compare {point}")
            for case in suite.iter("testcase"):
                case.set("name", f"{point}: {case.get('name')}")
            for key in totals:
                totals[key] += int(suite.get(key, "0"))
            root.append(suite)
    for key, value in totals.items():
        root.set(key, str(value))
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, "unicode") + "\n"


def to_dict(points: Points) -> dict[str, Any]:
    """JSON-ready data: a single run's `output.to_dict`; for a sweep,
    {"has_regression", "is_unusable", "points": [{"point": "point-4", ...its to_dict}]}."""
    if _is_single(points):
        return output.to_dict(points[0][1])
    return {
        "has_regression": has_regression(points),
        "is_unusable": is_unusable(points),
        "points": [{"point": point, **output.to_dict(c)} for point, c in points],
    }


def render_json(points: Points) -> str:
    return json.dumps(to_dict(points), indent=2, allow_nan=False) + "\n"


def render(points: Points, fmt: str) -> str:
    """The document in one of `FORMATS`."""
    renderers = {"table": render_table, "markdown": render_markdown, "json": render_json}
    return renderers[fmt](points)
