"""`llmbench profile --html`: the profile as a self-contained page (from its data alone).

Per (batch, context) point: a stacked bar per op — its roofline bound, then the time it loses
against it, together its measured time — and the ops with both bytes and FLOPs as points on the
roofline (with the whole step); then the table `llmbench profile` prints.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from llmbench.reports.figure import GREY, PALETTE, RED, Plot, hover, new_axes, styled
from llmbench.reports.html_report import Page, render_page
from llmbench.reports.roofline_axes import draw_roof, log_axes, marker_area, scatter_legend
from llmbench.reports.tables import sentence, si
from llmbench.roofline.ceilings import threads_text
from llmbench.roofline.profile_table import phase_text, subject

HEADER = (
    "op",
    "calls/step",
    "ms/step",
    "share",
    "MB/step",
    "GB/s",
    "GFLOP/s",
    "bound ms",
    "% roof",
    "lost ms",
)


def _key(point: dict[str, Any], name: str) -> str:
    return f"profile-{name}-b{point['batch']}-c{point['context']}"


@styled
def time_bars(point: dict[str, Any]) -> Plot:
    """Measured time per op as a stacked bar: the roofline bound, then the time lost."""
    ops = point["ops"]
    names = [row["op"] for row in ops] + ["unattributed"]
    bound = np.array([row["bound_ms"] for row in ops] + [0.0])
    lost = np.array([max(row["lost_ms"], 0.0) for row in ops] + [point["unattributed_ms"]])
    title = f"Where a step's time goes: batch {point['batch']}, context {point['context']}"
    figure, ax = new_axes((7.4, 0.3 * len(names) + 1.4), title, "ms per step", "")
    ys = np.arange(len(names))[::-1]
    bars_bound = ax.barh(ys, bound, color=PALETTE[0], label="roofline bound")
    bars_lost = ax.barh(ys, lost, left=bound, color=RED, alpha=0.55, label="lost against it")
    ax.set_yticks(ys, names)
    ax.grid(axis="y", visible=False)
    texts = [
        f"{row['op']}: {row['ms_per_step']:.3g} ms per step, bound {row['bound_ms']:.3g} ms, "
        f"lost {row['lost_ms']:.3g} ms"
        for row in ops
    ] + [f"unattributed (Python, dispatch): {point['unattributed_ms']:.3g} ms per step"]
    hover(list(bars_bound), texts)
    hover(list(bars_lost), texts)
    figure.legend(loc="outside upper right", ncols=2, frameon=False)
    caption = (
        f"Step {point['step_ms']:.3g} ms under the profiler against a roofline bound of "
        f"{point['bound_ms']:.3g} ms ({point['roof_fraction']:.0%} of the roof); blue: each "
        "op's own bound (its bytes and FLOPs at the roofs), light red: the time it loses."
    )
    return Plot(_key(point, "time"), figure, caption)


@styled
def op_roofline(point: dict[str, Any], roofs: dict[str, Any], dtype: str) -> Plot:
    """The ops with bytes and FLOPs, and the whole step, as points on the roofline."""
    bandwidth, peak = roofs["read_bytes_per_s"], roofs["flops_per_s"]
    placed = [r for r in point["ops"] if r["bytes"] and r["flops"] and r["ms_per_step"]]
    rows = [*placed, {**point, "op": "whole step", "ms_per_step": point["step_ms"]}]
    intensity = np.array([r["flops"] / r["bytes"] for r in rows])
    achieved = np.array([r["flops"] / (r["ms_per_step"] / 1e3) for r in rows])
    title = f"Ops on the roofline: batch {point['batch']}, context {point['context']}"
    figure, ax = new_axes((7.4, 4.6), title, "arithmetic intensity (FLOP/byte)", "FLOP/s")
    ridge = [peak / bandwidth, 4 * peak / bandwidth] if peak else []
    log_axes(ax, [*intensity, *ridge], [*achieved, *([peak] if peak else [])])
    draw_roof(ax, f"measured {dtype}", bandwidth, peak)
    for colour, row, x, y in zip(PALETTE, rows, intensity, achieved, strict=False):
        is_step = row["op"] == "whole step"
        marks = ax.scatter(
            [x],
            [y],
            s=marker_area(np.array([point["batch"]])) * (2 if is_step else 1),
            marker="*" if is_step else "o",
            color=GREY if is_step else colour,
            label=row["op"],
            zorder=3,
        )
        hover(
            marks,
            [
                f"{row['op']}: {row['ms_per_step']:.3g} ms per step, {si(row['bytes'], 'B')}, "
                f"{si(row['flops'], 'FLOP')}, {x:.3g} FLOP/B, {si(y, 'FLOP/s')}"
            ],
        )
    scatter_legend(ax)
    left_out = [r["op"] for r in point["ops"] if r not in placed]
    caption = "Each op at its own arithmetic intensity and achieved FLOP/s; the star is the step."
    if left_out:
        caption += f" Not on it (no FLOPs or no bytes in the cost model): {', '.join(left_out)}."
    return Plot(_key(point, "roofline"), figure, caption)


def table_rows(point: dict[str, Any]) -> list[list[str]]:
    """The text table's rows, formatted for the page."""

    def rate(value: float | None) -> str:
        return "-" if value is None else f"{value / 1e9:.1f}"

    rows = [
        [
            row["op"],
            f"{row['calls_per_step']:.0f}",
            f"{row['ms_per_step']:.3f}",
            f"{row['share']:.1%}",
            f"{row['bytes'] / 1e6:.2f}",
            rate(row["bytes_per_s"]),
            rate(row["flops_per_s"]),
            f"{row['bound_ms']:.3f}",
            "-" if row["roof_fraction"] is None else f"{row['roof_fraction']:.0%}",
            f"{row['lost_ms']:.3f}",
        ]
        for row in point["ops"]
    ]
    step_ms = point["step_ms"]
    rows.append(["attributed", "", f"{point['attributed_ms']:.3f}",
                 f"{point['attributed_fraction']:.1%}", "", "", "", "", "", ""])  # fmt: skip
    rows.append(["unattributed (Python, dispatch)", "", f"{point['unattributed_ms']:.3f}",
                 f"{point['unattributed_ms'] / step_ms:.1%}", "", "", "", "", "", ""])  # fmt: skip
    rows.append(
        [
            "step",
            "",
            f"{step_ms:.3f}",
            "100%",
            f"{point['bytes'] / 1e6:.2f}",
            rate(point["bytes_per_s"]),
            rate(point["flops_per_s"]),
            f"{point['bound_ms']:.3f}",
            f"{point['roof_fraction']:.0%}",
            f"{point['lost_ms']:.3f}",
        ]
    )
    return rows


def render(result: dict[str, Any]) -> Page:
    """The profile page; `.write(path)` saves it with its figures as PNGs beside it."""
    sections = []
    for point in result["points"]:
        plots = [time_bars(point), op_roofline(point, result["roofs"], result["dtype"])]
        sections.append(
            {
                "title": f"batch {point['batch']}, context {point['context']}",
                "plots": plots,
                "rows": table_rows(point),
                "notes": [
                    f"{point['step_ms_unprofiled']:.3g} ms per step without the profiler",
                    *point["warnings"],
                ],
            }
        )
    roofs = result["roofs"]
    flops = roofs["flops_per_s"]
    subtitle = (
        f"{phase_text(result)}, {result['num_steps']} profiled steps per point, "
        f"{threads_text(result['threads'])} on {result['device']}; roofs: read "
        f"{si(roofs['read_bytes_per_s'], 'B/s')} ({roofs['sources']['read_bytes_per_s']}), "
        f"matmul {result['dtype']} {si(flops, 'FLOP/s') if flops else 'unknown'}; load average "
        f"{result['loadavg_1m_before']:.2f} before, {result['loadavg_1m_after']:.2f} after "
        f"({result['cpu_count']} cores)"
    )
    return render_page(
        "profile.html.j2",
        [plot for section in sections for plot in section["plots"]],
        title=f"llmbench profile: {subject(result)}",
        subtitle=subtitle,
        warnings=[sentence(line) for line in result.get("warnings", ())],  # a busy machine
        sections=sections,
        header=HEADER,
    )
