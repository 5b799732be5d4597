"""The roofline drawn on matplotlib axes: log-log decades, roofs with their ridge, points sized
by batch; shared by the run report and the what-if page."""

from __future__ import annotations

import math

import numpy as np
from matplotlib.axes import Axes
from matplotlib.ticker import FuncFormatter, NullFormatter

from llmbench.reports.figure import GREY, hover
from llmbench.reports.tables import si

SI_TICKS = FuncFormatter(lambda value, _: si(value))  # 100M, 1G, 10G


def decades(values: list[float]) -> tuple[float, float]:
    """The whole powers of ten that hold every positive finite value (at least one decade)."""
    finite = [v for v in values if v > 0 and math.isfinite(v)] or [1.0, 10.0]
    lo, hi = math.floor(math.log10(min(finite))), math.ceil(math.log10(max(finite)))
    return 10.0**lo, 10.0 ** max(hi, lo + 1)


def log_axes(ax: Axes, x_values: list[float], y_values: list[float]) -> None:
    """Log-log axes over whole decades, ticks labelled with SI prefixes."""
    ax.set(xscale="log", yscale="log", xlim=decades(x_values), ylim=decades(y_values))
    for axis in (ax.xaxis, ax.yaxis):
        axis.set(major_formatter=SI_TICKS, minor_formatter=NullFormatter())


def draw_roof(ax: Axes, label: str, bytes_per_s: float, flops_per_s: float | None, **style) -> None:
    """The roofline min(AI · bandwidth, peak FLOP/s) across the x range, labelled with its
    peaks (the slanted roof alone when the FLOP/s peak is unknown); a solid roof also gets a
    dotted line at its ridge, AI = FLOP/s ÷ bandwidth."""
    style = {"color": "#222222", **style}
    if flops_per_s is None:
        xs = np.array(ax.get_xlim())
        label = f"{label}: {si(bytes_per_s, 'B/s')} (no FLOP/s roof)"
        ax.plot(xs, xs * bytes_per_s, lw=2, label=label, **style)
        return
    ridge = flops_per_s / bytes_per_s
    xs = np.array([ax.get_xlim()[0], ridge, ax.get_xlim()[1]])
    label = f"{label}: {si(bytes_per_s, 'B/s')}, {si(flops_per_s, 'FLOP/s')}"
    ax.plot(xs, np.minimum(xs * bytes_per_s, flops_per_s), lw=2, label=label, **style)
    if style.get("linestyle", "-") == "-":
        ax.vlines(ridge, ax.get_ylim()[0], flops_per_s, colors=GREY, linestyles=":", lw=1)
        ax.annotate(
            f"ridge {ridge:.3g} FLOP/B",
            (ridge, flops_per_s),
            xytext=(4, -12),
            textcoords="offset points",
            color=GREY,
            fontsize=8,
        )


def marker_area(batch: np.ndarray) -> np.ndarray:
    """Scatter marker area (pt²) that grows with the sequences in a step."""
    return 10 + 12 * np.sqrt(batch)


def draw_steps(
    ax: Axes,
    steps: list[tuple[int, dict]],
    seconds: np.ndarray,
    intensity: np.ndarray,
    achieved: np.ndarray,
    phase: str,
    label: str,
    name: str = "",
    **style,
) -> None:
    """The `phase` steps of (index, step) `steps` as points, each with its numbers on hover
    ("`name` decode step 3: 2 sequences, ..."), `label` once in the legend. One collection per
    batch size: equal markers are written once and reused in the SVG."""
    groups = [(s["phase"], s.get("num_seqs", 1)) for _, s in steps]  # (phase, batch) per point
    for size in sorted({b for p, b in groups if p == phase}):
        chosen = [k for k, group in enumerate(groups) if group == (phase, size)]
        points = ax.scatter(
            intensity[chosen],
            achieved[chosen],
            s=marker_area(size),
            lw=0.5,
            clip_on=False,  # the axes hold every point
            label=label,
            **style,
        )
        label = "_"  # the legend entry once
        texts = [
            f"{name}{phase} step {steps[k][0]}: {size} sequences, {seconds[k] * 1e3:.3g} ms, "
            f"{intensity[k]:.3g} FLOP/B, {si(achieved[k], 'FLOP/s')}"
            for k in chosen
        ]
        hover(points, texts)


def scatter_legend(ax: Axes) -> None:
    """A legend whose point markers are one size, whatever the batch sizes drawn."""
    for handle in ax.legend(loc="lower right").legend_handles:
        if hasattr(handle, "set_sizes"):
            handle.set_sizes([24])
