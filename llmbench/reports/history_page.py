"""The page of `llmbench compare --history --html`: each gated metric's series over the runs,
oldest first, with its segments' means and the runs where a shift began marked.

One self-contained page like the compare diff (a jinja2 template, inline CSS and SVG, no script,
no URL), drawn from what the history read: one value per run and metric.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np

from llmbench.compare.history import (
    History,
    MetricHistory,
    change_text,
    method_text,
    order_text,
    title,
    value_text,
)
from llmbench.reports.figure import BLUE, GREEN, GREY, RED, Plot, hover, new_axes, styled
from llmbench.reports.html_report import Page, render_page

SERIES_SIZE_IN = (6.4, 3.4)
MAX_TICK_LABELS = 16  # more runs than this: every k-th run's name under the axis
HEADER = ("metric", "gates", "runs", "change points", "last shift")


def _key(name: str) -> str:
    """A figure id unique in the page, safe in an id and in url(#...)."""
    return re.sub(r"[^A-Za-z0-9-]", "_", f"history-{name}")


@styled
def series_figure(metric: MetricHistory) -> Plot | None:
    """One metric's value per run (dots, the run and value on hover), each segment's mean (a
    grey line) and each change point (a dashed line at its first run: red a regression, green
    an improvement)."""
    if not metric.values:
        return None
    info = metric.info
    unit = "" if info.unit == "fraction" else f" ({info.unit})"
    figure, ax = new_axes(SERIES_SIZE_IN, info.name, "run (oldest first)", f"{info.name}{unit}")
    x = np.arange(len(metric.values))
    dots = ax.scatter(x, metric.values, s=18, color=BLUE, zorder=3)
    hover(
        dots,
        [f"{r}: {value_text(v, info)}" for r, v in zip(metric.runs, metric.values, strict=True)],
    )
    bounds = [0, *(p.index for p in metric.change_points), len(metric.values)]
    for start, end in zip(bounds, bounds[1:], strict=False):
        mean = float(np.mean(metric.values[start:end]))
        ax.hlines(mean, start - 0.4, end - 0.6, color=GREY, linewidth=1.5)
    for point in metric.change_points:
        colour = RED if point.is_regression else GREEN
        kind = "regression" if point.is_regression else "improvement"
        line = ax.axvline(point.index - 0.5, color=colour, linestyle="--", linewidth=1.2)
        line.set_label(f"{change_text(point, info)}: {kind}")
    stride = max(1, -(-len(x) // MAX_TICK_LABELS))
    ax.set_xticks(x[::stride], list(metric.runs[::stride]), rotation=45, ha="right")
    if metric.change_points:
        ax.legend(loc="best")
    shifts = "; ".join(change_text(p, info) for p in metric.change_points) or "no change point"
    caption = (
        f"{len(x)} runs, one value each (the mean over its repetitions, or the statistic over its "
        f"requests); grey lines: each segment's mean; dashed: where a shift began ({shifts})."
    )
    return Plot(_key(info.name), figure, caption)


def _row(metric: MetricHistory) -> list[str]:
    gates = ", ".join(g.name.removeprefix(f"{metric.info.name} ") for g in metric.gates)
    points = "; ".join(change_text(p, metric.info) for p in metric.change_points)
    last = "–"
    if metric.change_points:
        latest = metric.change_points[-1]
        last = "improvement" if not latest.is_regression else "regression within its gate"
        if metric.is_failing:
            last = "REGRESSION, still there"
    return [metric.info.name, gates, str(len(metric.values)), points or "none", last]


def render(history: History, metrics: Sequence[MetricHistory], *, seed: int) -> Page:
    """The page of a whole history: a table of the metrics' shifts, then one figure each."""
    figures = [series_figure(m) for m in metrics]
    return render_page(
        "history.html.j2",
        figures,
        title=title(history, metrics),
        subtitle=f"{order_text(history)} · {method_text(seed)}",
        header=HEADER,
        rows=[_row(m) for m in metrics],
        failing=[m.info.name for m in metrics if m.is_failing],
        plots=[f for f in figures if f is not None],
    )
