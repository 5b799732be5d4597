"""`report.html`: one self-contained file — inline CSS and SVG, no script, no external URL."""

from __future__ import annotations

import json
from collections.abc import Sequence
from html import escape

from llmbench.reports import plots, tables
from llmbench.reports.plots import Figure
from llmbench.reports.rundata import RunData

_CSS = """
body { font-family: system-ui, sans-serif; margin: 24px auto; max-width: 1560px; color: #222;
       padding: 0 16px; }
h1 { font-size: 22px; margin-bottom: 4px; } h2 { font-size: 17px; margin-top: 28px; }
.sub { color: #555; margin-top: 0; }
.warn { background: #fff4e0; border-left: 4px solid #E69F00; padding: 8px 12px; margin: 6px 0; }
.cards { display: flex; flex-wrap: wrap; gap: 10px; }
.card { border: 1px solid #ddd; border-radius: 6px; padding: 8px 12px; min-width: 150px; }
.card .label { font-size: 12px; color: #666; } .card .value { font-size: 18px; }
.figs { display: flex; flex-wrap: wrap; gap: 16px; }
figure { margin: 0; } figcaption { font-size: 12px; color: #555; max-width: 760px; }
table { border-collapse: collapse; font-size: 13px; margin: 6px 0; }
td, th { border: 1px solid #ddd; padding: 3px 8px; text-align: right; }
th { background: #f4f4f4; } td:first-child, th:first-child { text-align: left; }
.pairs td { text-align: left; }
pre { background: #f7f7f7; padding: 8px; font-size: 12px; overflow-x: auto; }
"""


class Html(str):
    """A cell that is already HTML (a link), not text to escape."""


def _cell(value: str) -> str:
    return value if isinstance(value, Html) else escape(value)


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{_cell(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _pairs(rows: Sequence[tuple[str, str]]) -> str:
    """A two-column label/value table."""
    body = "".join(f"<tr><th>{escape(k)}</th><td>{escape(v)}</td></tr>" for k, v in rows)
    return f'<table class="pairs">{body}</table>'


def figures_html(figures: Sequence[Figure | None]) -> str:
    shown = [f for f in figures if f is not None]
    return (
        '<div class="figs">'
        + "".join(
            f'<figure id="{f.key}">{f.svg}<figcaption>{escape(f.caption)}</figcaption></figure>'
            for f in shown
        )
        + "</div>"
    )


def page(title: str, body: list[str]) -> str:
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{escape(title)}</title><style>{_CSS}</style></head>\n<body>\n"
        + "\n".join(body)
        + "\n</body></html>\n"
    )


def render(run: RunData) -> str:
    """The report of one run folder."""
    p = run.provenance
    device = p.get("device", {})
    title = f"llmbench: {run.results.get('name')}"
    body = [
        f"<h1>{escape(title)}</h1>",
        f'<p class="sub">{escape(str(p.get("backend")))} · {escape(str(p.get("model")))} · '
        f"{escape(str(p.get('dtype')))} · {escape(str(device.get('name', device.get('url', ''))))}"
        f" · git {escape(str(p.get('git_sha') or '-'))}</p>",
    ]
    body += [f'<p class="warn">{escape(w)}</p>' for w in tables.warnings(run)]
    body.append(
        '<div class="cards">'
        + "".join(
            f'<div class="card"><div class="label">{escape(k)}</div>'
            f'<div class="value">{escape(v)}</div></div>'
            for k, v in tables.headline(run)
        )
        + "</div>"
    )
    body.append("<h2>Roofline</h2>")
    roofline = plots.roofline(run)
    if roofline is None:
        body.append(
            "<p>No roofline: no timed steps (the transformers baseline reports none, and an "
            "interrupted run may have none yet).</p>"
        )
    else:
        body.append(figures_html([roofline]))
        body.append(_pairs(tables.roofs(run)))
        body.append(
            table(
                ("phase", "steps", "seconds", "bandwidth", "compute", "FLOP/B", "MBU", "MFU"),
                tables.phase_rows(run),
            )
        )
    body.append("<h2>Latency</h2>")
    body.append(
        figures_html(
            [
                plots.latency_cdf(run, "ttft_ms"),
                plots.latency_cdf(run, "tpot_ms"),
                plots.itl_histogram(run),
            ]
        )
    )
    body.append(table(("metric (ms)", *tables.QUANTILES, "count"), tables.latency_rows(run)))
    slo = tables.slo_rows(run)
    if slo:
        body.append("<h2>SLOs and goodput</h2>")
        body.append(table(("SLO", "limit", "met", "share"), slo))
    body.append("<h2>Over time</h2>")
    body.append(figures_html(plots.timeline(run)))
    sessions = tables.session_rows(run)
    if sessions:
        body.append("<h2>Sessions</h2>")
        body.append(_pairs(sessions))
        body.append(figures_html([plots.session_waterfall(run)]))
    body.append("<h2>Provenance</h2>")
    body.append(_pairs(tables.provenance_rows(run)))
    body.append(
        "<details><summary>spec</summary><pre>"
        + escape(json.dumps(run.results.get("spec", {}), indent=2))
        + "</pre></details>"
    )
    return page(title, body)


def render_sweep(name: str, points: list[RunData]) -> str:
    """The report of a sweep folder: latency-vs-throughput curves and a row per point."""
    rows = [
        [
            *row,
            Html(f'<a href="{escape(run.folder.name)}/report.html">{escape(run.folder.name)}</a>'),
        ]
        for row, run in zip(tables.sweep_rows(points), points, strict=True)
    ]
    title = f"llmbench sweep: {name}"
    body = [
        f"<h1>{escape(title)}</h1>",
        figures_html(plots.sweep_curves(points)),
        table((*tables.SWEEP_HEADER, "report"), rows),
    ]
    return page(title, body)
