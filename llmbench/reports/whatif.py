"""`llmbench roofline --html`: the what-if table as a page of figures (from its JSON alone).

Three figures: the predicted decode steps on the roofline, decode tokens/s against batch, and
the TPOT bound against batch, one line per context length.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from llmbench.reports.figure import PALETTE, Plot, hover, new_axes, styled
from llmbench.reports.html_report import Page, render_page
from llmbench.reports.roofline_axes import draw_roof, log_axes, marker_area, scatter_legend
from llmbench.reports.tables import si


def _by_context(points: list[dict[str, Any]]) -> dict[int, list[dict[str, Any]]]:
    out: dict[int, list[dict[str, Any]]] = {}
    for point in points:
        out.setdefault(point["context"], []).append(point)
    return out


def _attainable_flops_per_s(point: dict[str, Any]) -> float:
    return point["flops_per_step"] / (point["decode_step_ms"] / 1e3)


def _experts_text(point: dict[str, Any]) -> str:
    """The hover text's tail for a MoE model's point (", 3.5 experts per layer"); "" if dense."""
    touched = point.get("experts_touched_per_layer")
    return "" if touched is None else f", {touched:.3g} experts per layer"


@styled
def roofline(result: dict[str, Any]) -> Plot:
    """Every (context, batch) decode step at the bound the roofs allow, on the roofline."""
    bandwidth, peak = result["peak_bytes_per_s"], result["peak_flops_per_s"]
    ridge = peak / bandwidth
    points = result["points"]
    title, x_label = "Decode steps on the roofline", "arithmetic intensity (FLOP/byte)"
    figure, ax = new_axes((7.4, 4.6), title, x_label, "attainable FLOP/s")
    log_axes(
        ax,
        [*(p["arithmetic_intensity"] for p in points), ridge, ridge * 4],
        [*map(_attainable_flops_per_s, points), peak],
    )
    draw_roof(ax, result["hardware"], bandwidth, peak)
    for colour, (context, rows) in zip(PALETTE, _by_context(points).items(), strict=False):
        xs = [r["arithmetic_intensity"] for r in rows]
        ys = [_attainable_flops_per_s(r) for r in rows]
        batch = np.array([r["batch"] for r in rows])
        marks = ax.scatter(xs, ys, s=marker_area(batch), color=colour, label=f"context {context}")
        hover(
            marks,
            [
                f"context {context}, batch {r['batch']}: {r['decode_step_ms']:.3g} ms per step, "
                f"{r['decode_tok_per_s']:,.0f} tok/s, {r['bound']}-bound" + _experts_text(r)
                for r in rows
            ],
        )
        for x, y, b in zip(xs, ys, batch, strict=True):
            ax.annotate(f"B={b}", (x, y), xytext=(5, 4), textcoords="offset points", color=colour)
    scatter_legend(ax)
    caption = (
        "Each point is one decode step of B sequences at the given context, at the bound the "
        "roofs allow: on the slanted roof it is memory-bound, on the flat one compute-bound."
    )
    return Plot("whatif-roofline", figure, caption)


@styled
def against_batch(result: dict[str, Any], key: str, title: str, unit: str) -> Plot:
    """One predicted quantity against the decode batch, a line per context, the ridge dashed."""
    groups = _by_context(result["points"])
    figure, ax = new_axes((5.9, 3.6), title, "decode batch", unit)
    log_axes(ax, [p["batch"] for p in result["points"]], [p[key] for p in result["points"]])
    for colour, (context, rows) in zip(PALETTE, groups.items(), strict=False):
        xs, ys = [r["batch"] for r in rows], [r[key] for r in rows]
        ax.plot(xs, ys, color=colour, label=f"context {context}")
        marks = ax.scatter(xs, ys, color=colour, s=18, zorder=3)
        hover(
            marks,
            [f"context {context}, batch {x}: {y:.4g} {unit}" for x, y in zip(xs, ys, strict=True)],
        )
        ridge = rows[0]["ridge_batch"]
        if ridge is not None and ax.get_xlim()[0] <= ridge <= ax.get_xlim()[1]:
            ax.axvline(ridge, color=colour, linestyle="--", linewidth=1)
    ax.legend(loc="best")
    if any(rows[0]["ridge_batch"] for rows in groups.values()):
        caption = "Dashed: the batch where decode turns compute-bound (the ridge), per context."
    else:
        caption = (
            "No batch up to 65,536 makes decode compute-bound at these contexts: each sequence "
            "brings its own KV traffic, so FLOPs and bytes grow together."
        )
    return Plot(f"whatif-{key}", figure, caption)


def render(result: dict[str, Any]) -> Page:
    """The what-if page; `.write(path)` saves it with its figures as PNGs beside it."""
    figures = [
        roofline(result),
        against_batch(result, "decode_tok_per_s", "Decode tokens/s (bound)", "tokens/s"),
        against_batch(result, "tpot_ms_bound", "TPOT bound", "ms per token"),
    ]
    is_moe = bool(result.get("num_experts"))
    rows = [
        [
            str(p["context"]),
            str(p["batch"]),
            f"{p['decode_step_ms']:.3g}",
            f"{p['decode_tok_per_s']:,.0f}",
            p["bound"],
            f"{p['arithmetic_intensity']:.3g}",
            si(p["bytes_per_step"], "B"),
            *([f"{p['experts_touched_per_layer']:.2f}"] if is_moe else []),
            f"{p['ttft_ms_bound']:.3g}",
            str(p["ridge_batch"] or "-"),
        ]
        for p in result["points"]
    ]
    experts = ("experts / layer",) if is_moe else ()
    subtitle = (
        f"{result['dtype']} weights, {result['kv_dtype']} KV cache, tp={result['tp']}; "
        f"{si(result['peak_bytes_per_s'], 'B/s')}, {si(result['peak_flops_per_s'], 'FLOP/s')}"
    )
    if is_moe:
        subtitle += (
            f"; {result['num_experts']} experts per layer, top-{result['num_experts_per_tok']}: "
            "a decode step of B sequences reads E(1 − (1 − k/E)^B) of them per layer, expected "
            "under uniform routing"
        )
    return render_page(
        "whatif.html.j2",
        figures,
        title=f"llmbench roofline: {result['model']} on {result['hardware']}",
        subtitle=subtitle,
        plots=figures,
        header=(
            "context",
            "batch",
            "step ms",
            "tok/s",
            "bound",
            "FLOP/B",
            "bytes/step",
            *experts,
            "TTFT ms",
            "ridge B",
        ),
        rows=rows,
    )
