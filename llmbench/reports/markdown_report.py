"""`report.md`: the numbers of a run as Markdown tables, for CI job summaries and PR comments."""

from __future__ import annotations

from collections.abc import Sequence

from llmbench.reports import tables
from llmbench.reports.rundata import RunData


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
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
    lines += markdown_table(("", ""), tables.headline(run))
    repetitions = tables.repetition_rows(run)
    if repetitions:
        lines += ["## Repetitions", "", tables.REPETITION_NOTE, ""]
        lines += markdown_table(tables.REPETITION_HEADER, repetitions)
    lines += ["## Latency (ms)", ""]
    lines += markdown_table(("metric", *tables.QUANTILES, "count"), tables.latency_rows(run))
    split = tables.server_client_rows(run)
    if split:
        lines += ["## Server vs client", "", tables.SERVER_CLIENT_NOTE, ""]
        lines += markdown_table(tables.SERVER_CLIENT_HEADER, split)
    cost = tables.cost_rows(run)
    if cost:
        lines += ["## Cost", ""] + markdown_table(("", ""), cost)
    endpoints = tables.endpoint_rows(run)
    if endpoints:
        lines += ["## Endpoints", "", tables.endpoint_note(run), ""]
        lines += markdown_table(tables.ENDPOINT_HEADER, endpoints)
    phases = tables.phase_rows(run)
    if phases:
        lines += ["## Roofline", ""]
        lines += [f"- {label}: {value}" for label, value in tables.roofs(run)] + [""]
        lines += markdown_table(tables.PHASE_HEADER, phases)
    experts = tables.expert_rows(run)
    if experts:
        lines += ["## Mixture of experts", ""] + markdown_table(("", ""), experts)
    speculative = tables.speculative_rows(run)
    if speculative:
        lines += ["## Speculative decoding", ""] + markdown_table(("", ""), speculative)
    slo = tables.slo_rows(run)
    if slo:
        lines += ["## SLOs", ""] + markdown_table(tables.SLO_HEADER, slo)
    sessions = tables.session_rows(run)
    if sessions:
        lines += ["## Sessions", ""] + markdown_table(("", ""), sessions)
    lines += ["## Provenance", ""] + markdown_table(("", ""), tables.provenance_rows(run))
    return "\n".join(lines)


def render_sweep(name: str, points: list[RunData]) -> str:
    rows = tables.sweep_rows(points)
    busy = tables.busy_warnings([(run.folder.name, run) for run in points])
    lines = [f"# llmbench sweep: {name}", "", *(f"> **warning:** {line}" for line in busy)]
    lines += [""] if busy else []
    capacity = tables.sweep_capacity(points)
    lines += [capacity, ""] if capacity else []
    return "\n".join([*lines, *markdown_table(tables.sweep_header(points), rows)])
