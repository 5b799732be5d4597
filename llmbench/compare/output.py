"""A comparison's verdict table as text: for a terminal, Markdown, JUnit XML and JSON.

Pure functions from a `Comparison` to a string; nothing here reads or writes files.
"""

from __future__ import annotations

import json
import math
import xml.etree.ElementTree as ET
from typing import Any

from llmbench.compare.gates import format_percent
from llmbench.compare.verdict import NO_INTERVAL, WITHOUT_VERDICT, Comparison, GateResult

HEADER = ("gate", "BASE", "NEW", "change", "CI", "verdict")


def _value(x: float | None, unit: str) -> str:
    if x is None:
        return "–"
    return f"{x:.4g}" if unit == "fraction" else f"{x:.4g} {unit}"


def _percent(x: float | None) -> str:
    if x is None:
        return "–"
    return f"{x * 100:+.1f}%" if math.isfinite(x) else ("+inf%" if x > 0 else "-inf%")


def _interval(result: GateResult) -> str:
    """The delta's interval for relative gates, the new value's for `min` / `max` gates;
    `NO_INTERVAL` where a single repetition gives none."""
    n = result.numbers
    if result.gate.is_relative:
        if not n.has_delta_interval:
            return NO_INTERVAL
        if n.delta_low is None:
            return "–"
        return f"{_percent(n.delta_low)} … {_percent(n.delta_high)}"
    if not n.has_new_interval:
        return NO_INTERVAL
    if n.new_low is None:
        return "–"
    return f"{n.new_low:.4g} … {n.new_high:.4g}"


def gate_row(result: GateResult) -> tuple[str, ...]:
    """One gate's cells, in `HEADER` order."""
    n, unit = result.numbers, result.gate.info.unit
    return (
        result.gate.name,
        _value(n.baseline, unit),
        _value(n.new, unit),
        _percent(n.delta),
        _interval(result),
        result.verdict,
    )


def _counts(comparison: Comparison) -> str:
    """`1 regression, 2 within noise` in a fixed order."""
    order = ("regression", "inconclusive", "refused", "no data", "within noise", "improvement")
    order += ("pass",)
    found = [r.verdict for r in comparison.results]
    parts = [f"{found.count(v)} {v}" for v in order if v in found]
    return ", ".join(parts) if parts else "no gates"


def _side(name: str, device: str, is_busy: bool) -> str:
    return f"{name}: {device}{' (machine busy)' if is_busy else ''}"


def _sides(comparison: Comparison) -> list[str]:
    return [
        _side("BASE", comparison.baseline_device, comparison.is_baseline_busy),
        _side("NEW", comparison.new_device, comparison.is_new_busy),
    ]


def outcome(comparison: Comparison) -> str:
    """REGRESSION, NO VERDICT (a gate refused or without data: not a pass), or no regression."""
    if comparison.has_regression:
        return "REGRESSION"
    return "NO VERDICT" if comparison.is_unusable else "no regression"


def _title(comparison: Comparison) -> str:
    rounds = "" if comparison.num_rounds is None else f"; {comparison.num_rounds} paired rounds"
    return f"{comparison.command}: {outcome(comparison)} ({_counts(comparison)}{rounds})"


def _ci_label(comparison: Comparison) -> str:
    return f"{comparison.confidence * 100:g}% CI"


def _notes(comparison: Comparison) -> list[str]:
    """One line per gate that did not simply pass or stay within noise."""
    quiet = ("within noise", "pass")
    return [f"{r.gate.name}: {r.reason}" for r in comparison.results if r.verdict not in quiet]


def render_table(comparison: Comparison) -> str:
    """A plain-text table for a terminal: title, both sides, one aligned row per gate, notes."""
    header = HEADER[:4] + (_ci_label(comparison), HEADER[5])
    rows = [header] + [gate_row(r) for r in comparison.results]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = [_title(comparison), *_sides(comparison), ""]
    for k, row in enumerate(rows):
        cells = [
            c.ljust(w) if i in (0, 5) else c.rjust(w)
            for i, (c, w) in enumerate(zip(row, widths, strict=True))
        ]
        lines.append("  ".join(cells).rstrip())
        if k == 0:
            lines.append("  ".join("-" * w for w in widths))
    notes = _notes(comparison)
    if notes:
        lines += ["", *notes]
    return "\n".join(lines) + "\n"


def _md_cell(text: str) -> str:
    return text.replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ")


def render_markdown(comparison: Comparison) -> str:
    """GitHub-flavoured Markdown: a heading, both sides, the verdict table, then the notes."""
    header = HEADER[:4] + (_ci_label(comparison), HEADER[5])
    lines = [f"### {_md_cell(_title(comparison))}", ""]
    lines += [f"- {_md_cell(s)}" for s in _sides(comparison)]
    lines += ["", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for result in comparison.results:
        cells = list(map(_md_cell, gate_row(result)))
        cells[0] = f"`{cells[0]}`"
        if result.is_failing:
            cells[5] = f"**{cells[5]}**"
        lines.append("| " + " | ".join(cells) + " |")
    notes = _notes(comparison)
    if notes:
        lines += ["", *(f"- {_md_cell(n)}" for n in notes)]
    return "\n".join(lines) + "\n"


def render_junit(comparison: Comparison) -> str:
    """JUnit XML: one <testcase> per gate; a regression is a <failure>, a refused or unmeasured
    gate an <error> (no silent pass; <skipped> when missing verdicts are allowed), an
    inconclusive one <skipped>; every case carries its reason."""
    tags = [_junit_tag(r.verdict, comparison.allow_missing) for r in comparison.results]
    suites = ET.Element("testsuites", name=comparison.command)
    suite = ET.SubElement(
        suites,
        "testsuite",
        name=comparison.command,
        tests=str(len(tags)),
        failures=str(tags.count("failure")),
        errors=str(tags.count("error")),
        skipped=str(tags.count("skipped")),
    )
    properties = ET.SubElement(suite, "properties")
    for name, value in (
        ("baseline_device", comparison.baseline_device),
        ("new_device", comparison.new_device),
        ("baseline_busy", str(comparison.is_baseline_busy).lower()),
        ("new_busy", str(comparison.is_new_busy).lower()),
        ("confidence", f"{comparison.confidence:g}"),
        ("num_resamples", str(comparison.num_resamples)),
        ("seed", str(comparison.seed)),
    ):
        ET.SubElement(properties, "property", name=name, value=value)
    for result in comparison.results:
        case = ET.SubElement(
            suite,
            "testcase",
            classname=comparison.command.replace(" ", "."),
            name=result.gate.name,
            time="0",
        )
        tag = _junit_tag(result.verdict, comparison.allow_missing)
        if tag is not None:
            ET.SubElement(
                case, tag, message=result.reason, type=result.verdict
            ).text = result.reason
        ET.SubElement(case, "system-out").text = f"{result.verdict}: {result.reason}"
    ET.indent(suites)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(suites, "unicode") + "\n"


def _junit_tag(verdict: str, allow_missing: bool) -> str | None:
    if verdict == "regression":
        return "failure"
    if verdict in WITHOUT_VERDICT:
        return "skipped" if allow_missing else "error"
    return "skipped" if verdict == "inconclusive" else None


def _finite(x: float | None) -> float | None:
    """JSON has no infinity: an unbounded end of an interval is null."""
    return x if x is not None and math.isfinite(x) else None


def to_dict(comparison: Comparison) -> dict[str, Any]:
    """The comparison as plain JSON-ready data (fractions for changes, units for values)."""
    gates = []
    for r in comparison.results:
        n, info = r.numbers, r.gate.info
        gates.append(
            {
                "gate": r.gate.name,
                "metric": r.gate.metric,
                "rule": r.gate.rule,
                "threshold": r.gate.threshold,
                "threshold_text": (
                    format_percent(r.gate.threshold) if r.gate.is_relative else None
                ),
                "unit": info.unit,
                "metric_kind": info.kind,
                "baseline": _finite(n.baseline),
                "new": _finite(n.new),
                "delta": _finite(n.delta),
                "delta_ci": [_finite(n.delta_low), _finite(n.delta_high)],
                "new_ci": [_finite(n.new_low), _finite(n.new_high)],
                "num_baseline_repetitions": n.num_baseline_repetitions,
                "num_new_repetitions": n.num_new_repetitions,
                "verdict": r.verdict,
                "reason": r.reason,
            }
        )
    return {
        "has_regression": comparison.has_regression,
        "is_unusable": comparison.is_unusable,  # a gate without a verdict: exit 2
        "baseline": {"device": comparison.baseline_device, "is_busy": comparison.is_baseline_busy},
        "new": {"device": comparison.new_device, "is_busy": comparison.is_new_busy},
        "confidence": comparison.confidence,
        "num_resamples": comparison.num_resamples,
        "seed": comparison.seed,
        "num_rounds": comparison.num_rounds,  # paired rounds of `llmbench ab`; null: two runs
        "gates": gates,
    }


def render_json(comparison: Comparison) -> str:
    return json.dumps(to_dict(comparison), indent=2, allow_nan=False) + "\n"
