"""`report.html`: one self-contained page from a jinja2 template (inline CSS and SVG, no script,
no external URL), with every figure also written as a PNG under `figures/` beside it."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2

from llmbench.reports import expert_plots, figure, plots, tables
from llmbench.reports.figure import Plot
from llmbench.reports.rundata import RunData

TEMPLATES = jinja2.Environment(
    loader=jinja2.PackageLoader("llmbench.reports", "templates"),
    autoescape=True,
    undefined=jinja2.StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
)
TEMPLATES.filters["svg"] = figure.svg


@dataclass(frozen=True)
class Page:
    html: str
    plots: list[Plot]

    def write(self, html_path: Path) -> Path:
        """Write the page and its figures as `figures/<key>.png` next to it."""
        html_path.write_text(self.html)
        if self.plots:
            (html_path.parent / "figures").mkdir(exist_ok=True)
        for plot in self.plots:
            (html_path.parent / "figures" / f"{plot.key}.png").write_bytes(figure.png(plot))
        return html_path


def render_page(template: str, shown: list[Plot | None], **context: Any) -> Page:
    """Fill a template; `shown` lists the page's figures (None: a figure without data)."""
    html = TEMPLATES.get_template(template).render(**context)
    return Page(html, [p for p in shown if p is not None])


def render(run: RunData) -> Page:
    """The report of one run folder."""
    latency = [plots.latency_cdf(run, "ttft_ms"), plots.latency_cdf(run, "tpot_ms")]
    latency = [f for f in [*latency, plots.itl_histogram(run)] if f is not None]
    roofline, timeline, waterfall = plots.roofline(run), plots.timeline(run), None
    experts = expert_plots.figures(run)  # a mixture of experts only
    sessions = tables.session_rows(run)
    if sessions:
        waterfall = plots.session_waterfall(run)
    split = [plots.server_client(run, "ttft"), plots.server_client(run, "tpot")]
    split = [f for f in split if f is not None]
    return render_page(
        "report.html.j2",
        [roofline, *experts, *latency, *split, *timeline, waterfall],
        title=f"llmbench: {run.results.get('name')}",
        subtitle=tables.what_ran(run),
        banner=tables.failure_banner(run),
        warnings=tables.warnings(run),
        cards=tables.headline(run),
        repetition_note=tables.REPETITION_NOTE,
        repetition_header=tables.REPETITION_HEADER,
        repetition_rows=tables.repetition_rows(run),
        roofline=roofline,
        roofs=tables.roofs(run),
        phase_header=tables.PHASE_HEADER,
        phases=tables.phase_rows(run),
        latency=latency,
        latency_header=("metric (ms)", *tables.QUANTILES, "count"),
        latency_rows=tables.latency_rows(run),
        server_client_note=tables.SERVER_CLIENT_NOTE,
        server_client_header=tables.SERVER_CLIENT_HEADER,
        server_client_rows=tables.server_client_rows(run),
        cost=tables.cost_rows(run),
        endpoint_header=tables.ENDPOINT_HEADER,
        endpoint_rows=tables.endpoint_rows(run),
        endpoint_note=tables.endpoint_note(run),
        server_client=split,
        speculative=tables.speculative_rows(run),
        slo_header=tables.SLO_HEADER,
        slo_rows=tables.slo_rows(run),
        timeline=timeline,
        experts=experts,
        expert_rows=tables.expert_rows(run),
        sessions=sessions,
        waterfall=waterfall,
        provenance=tables.provenance_rows(run),
        spec=json.dumps(run.results.get("spec", {}), indent=2),
    )


def render_sweep(name: str, points: list[RunData]) -> Page:
    """The report of a sweep folder: the points that ran on a busy machine named first, the
    highest load that met the SLOs (with SLOs), then latency-vs-throughput curves and a row per
    point."""
    curves = plots.sweep_curves(points)
    rows = zip(tables.sweep_rows(points), [run.folder.name for run in points], strict=True)
    return render_page(
        "sweep.html.j2",
        curves,
        title=f"llmbench sweep: {name}",
        subtitle="",
        warnings=tables.busy_warnings([(run.folder.name, run) for run in points]),
        capacity=tables.sweep_capacity(points),
        plots=curves,
        header=tables.sweep_header(points),
        rows=list(rows),
    )
