"""`report.md`: the numbers of a run as Markdown tables, for CI job summaries and PR comments."""

from __future__ import annotations

from collections.abc import Sequence

from llmbench.reports import tables
from llmbench.reports.rundata import RunData


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"

    return [line(header), "|" + "---|" * len(header), *(line(row) for row in rows), ""]


def render(run: RunData) -> str:
    lines = [f"# llmbench: {run.results.get('name')}", "", tables.what_ran(run), ""]
    banner = tables.failure_banner(run)
    if banner:
        lines += [f"> **FAILED REQUESTS:** {banner}", ""]
    warnings = tables.warnings(run)
    lines += [f"> **warning:** {w}" for w in warnings]
    if warnings:
        lines.append("")
    lines += _table(("", ""), tables.headline(run))
    repetitions = tables.repetition_rows(run)
    if repetitions:
        lines += ["## Repetitions", "", tables.REPETITION_NOTE, ""]
        lines += _table(tables.REPETITION_HEADER, repetitions)
    lines += ["## Latency (ms)", ""]
    lines += _table(("metric", *tables.QUANTILES, "count"), tables.latency_rows(run))
    split = tables.server_client_rows(run)
    if split:
        lines += ["## Server vs client", "", tables.SERVER_CLIENT_NOTE, ""]
        lines += _table(tables.SERVER_CLIENT_HEADER, split)
    phases = tables.phase_rows(run)
    if phases:
        lines += ["## Roofline", ""]
        lines += [f"- {label}: {value}" for label, value in tables.roofs(run)] + [""]
        lines += _table(tables.PHASE_HEADER, phases)
    experts = tables.expert_rows(run)
    if experts:
        lines += ["## Mixture of experts", ""] + _table(("", ""), experts)
    slo = tables.slo_rows(run)
    if slo:
        lines += ["## SLOs", ""] + _table(tables.SLO_HEADER, slo)
    sessions = tables.session_rows(run)
    if sessions:
        lines += ["## Sessions", ""] + _table(("", ""), sessions)
    lines += ["## Provenance", ""] + _table(("", ""), tables.provenance_rows(run))
    return "\n".join(lines)


def render_sweep(name: str, points: list[RunData]) -> str:
    rows = tables.sweep_rows(points)
    return "\n".join([f"# llmbench sweep: {name}", "", *_table(tables.SWEEP_HEADER, rows)])
