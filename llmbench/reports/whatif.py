"""`llmbench roofline --html`: the what-if table as plots (from its JSON alone).

Three figures: the predicted decode steps on the roofline, decode tokens/s against batch, and
the TPOT bound against batch, one line per context length.
"""

from __future__ import annotations

from html import escape
from typing import Any

from llmbench.reports.html_report import figures_html, page, table
from llmbench.reports.plots import Figure, draw_roof
from llmbench.reports.svg import PALETTE, Chart, Scale, si


def _by_context(points: list[dict[str, Any]]) -> dict[int, list[dict[str, Any]]]:
    out: dict[int, list[dict[str, Any]]] = {}
    for point in points:
        out.setdefault(point["context"], []).append(point)
    return out


def _roofline(result: dict[str, Any]) -> Figure:
    bandwidth, peak = result["peak_bytes_per_s"], result["peak_flops_per_s"]
    ridge = peak / bandwidth
    points = result["points"]
    intensity = [p["arithmetic_intensity"] for p in points]
    achievable = [p["flops_per_step"] / (p["decode_step_ms"] / 1e3) for p in points]
    chart = Chart(
        "Decode steps on the roofline",
        "arithmetic intensity (FLOP/byte)",
        "attainable FLOP/s",
        Scale.fit([*intensity, ridge, ridge * 4], is_log=True),
        Scale.fit([*achievable, peak], is_log=True),
        width=760,
        height=440,
        legend_at_bottom=True,
    )
    draw_roof(chart, result["hardware"], bandwidth, peak)
    for colour, (context, rows) in zip(PALETTE, _by_context(points).items(), strict=False):
        chosen = [points.index(r) for r in rows]
        chart.points(
            [intensity[i] for i in chosen],
            [achievable[i] for i in chosen],
            colour,
            f"context {context}",
            radii=[3 + r["batch"] ** 0.5 for r in rows],
        )
        for i, r in zip(chosen, rows, strict=True):
            chart.label(intensity[i], achievable[i], f"B={r['batch']}", colour)
    caption = (
        "Each point is one decode step of B sequences at the given context, at the bound the "
        "roofs allow: on the slanted roof it is memory-bound, on the flat one compute-bound."
    )
    return Figure("whatif-roofline", chart.svg(), caption)


def _against_batch(result: dict[str, Any], key: str, title: str, unit: str) -> Figure:
    groups = _by_context(result["points"])
    batches = [p["batch"] for p in result["points"]]
    values = [p[key] for p in result["points"]]
    chart = Chart(
        title,
        "decode batch",
        unit,
        Scale.fit(batches, is_log=True),
        Scale.fit(values, is_log=True),
        width=470,
        height=320,
    )
    for colour, (context, rows) in zip(PALETTE, groups.items(), strict=False):
        chart.line([r["batch"] for r in rows], [r[key] for r in rows], colour, f"context {context}")
        chart.points([r["batch"] for r in rows], [r[key] for r in rows], colour)
        ridge = rows[0]["ridge_batch"]
        if ridge is not None and chart.x.lo <= ridge <= chart.x.hi:
            chart.line([ridge, ridge], [chart.y.lo, chart.y.hi], colour, dash="2 3", width=1)
    if any(rows[0]["ridge_batch"] for rows in groups.values()):
        caption = "Dashed: the batch where decode turns compute-bound (the ridge), per context."
    else:
        caption = (
            "No batch up to 65,536 makes decode compute-bound at these contexts: each sequence "
            "brings its own KV traffic, so FLOPs and bytes grow together."
        )
    return Figure(f"whatif-{key}", chart.svg(), caption)


def render(result: dict[str, Any]) -> str:
    title = f"llmbench roofline: {result['model']} on {result['hardware']}"
    header = (
        f"{result['dtype']} weights, {result['kv_dtype']} KV cache, tp={result['tp']}; "
        f"{si(result['peak_bytes_per_s'], 'B/s')}, {si(result['peak_flops_per_s'], 'FLOP/s')}"
    )
    rows = [
        [
            str(p["context"]),
            str(p["batch"]),
            f"{p['decode_step_ms']:.3g}",
            f"{p['decode_tok_per_s']:,.0f}",
            p["bound"],
            f"{p['arithmetic_intensity']:.3g}",
            f"{p['ttft_ms_bound']:.3g}",
            str(p["ridge_batch"] or "-"),
        ]
        for p in result["points"]
    ]
    figures = [
        _roofline(result),
        _against_batch(result, "decode_tok_per_s", "Decode tokens/s (bound)", "tokens/s"),
        _against_batch(result, "tpot_ms_bound", "TPOT bound", "ms per token"),
    ]
    return page(
        title,
        [
            f"<h1>{escape(title)}</h1>",
            f'<p class="sub">{escape(header)}</p>',
            figures_html(figures),
            table(
                ("context", "batch", "step ms", "tok/s", "bound", "FLOP/B", "TTFT ms", "ridge B"),
                rows,
            ),
        ],
    )
