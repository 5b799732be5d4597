"""The figures of a variants report, drawn with matplotlib from the variants' run folders:
throughput and TPOT per variant as bars, TTFT and TPOT CDFs one curve per variant, and speed
against quality when the variants measured it."""

from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure

from llmbench.harness import metrics
from llmbench.reports.figure import PALETTE, Plot, hover, new_axes, styled
from llmbench.reports.plots import SMALL_IN
from llmbench.reports.variant_tables import VariantRun, measured


def _colour(i: int) -> str:
    return PALETTE[i % len(PALETTE)]


@styled
def speed_bars(variants: list[VariantRun]) -> Plot | None:
    """Output tokens/s and TPOT p50 of each measured variant, side by side, in variant order."""
    shown = measured(variants)
    if not shown:
        return None
    names = [v.name for v in shown]
    figure = Figure(figsize=(7.6, 0.5 * len(shown) + 1.4), layout="constrained")
    panels = (
        ("output tokens/s", "output_tok_per_s", None, "{:.1f} tok/s"),
        ("TPOT p50 (ms)", "tpot_ms", "p50", "{:.2f} ms"),
    )
    for k, (title, key, statistic, text) in enumerate(panels):
        ax = figure.add_subplot(1, 2, k + 1)
        ax.set(title=title if k else f"Variants: {title}")
        values = [
            (v.run.summary.get(key) or {}).get(statistic) if statistic else v.run.summary.get(key)
            for v in shown
        ]
        heights = [0.0 if x is None else x for x in values]
        y = np.arange(len(shown))[::-1]  # the first variant on top
        bars = ax.barh(y, heights, color=[_colour(i) for i in range(len(shown))], alpha=0.85)
        hover(
            bars,
            [
                f"{n}: " + ("-" if x is None else text.format(x))
                for n, x in zip(names, values, strict=True)
            ],
        )
        ax.set_yticks(y, names if k == 0 else [""] * len(names))
        ax.grid(axis="y", visible=False)
        ax.set_xlim(0, 1.15 * max(heights) if max(heights) > 0 else 1.0)
    caption = (
        "Each bar is one variant's whole run: output tokens/s over the measured window (longer "
        "is faster) and the median time per output token (shorter is faster)."
    )
    return Plot("variants-speed", figure, caption)


@styled
def latency_cdfs(variants: list[VariantRun], name: str) -> Plot | None:
    """Empirical CDF of one per-request latency (`ttft_ms` or `tpot_ms`), a curve per variant."""
    fn = {"ttft_ms": metrics.ttft_ms, "tpot_ms": metrics.tpot_ms}[name]
    curves = []
    for i, v in enumerate(variants):
        if v.run is None:
            continue
        values = np.sort([x for x in (fn(r) for r in v.run.requests) if x is not None])
        if values.size:
            curves.append((i, v.name, values))
    if not curves:
        return None
    title = f"{name.removesuffix('_ms').upper()} CDF by variant"
    figure, ax = new_axes(SMALL_IN, title, f"{name} (ms)", "fraction of requests")
    for i, label, values in curves:
        ax.ecdf(values, color=_colour(i), label=label)
        p50 = float(np.percentile(values, 50))
        mark = ax.scatter([p50], [0.5], s=14, color=_colour(i), zorder=3)
        hover(mark, [f"{label}: p50 {p50:.2f} ms"])
    ax.set(xlim=(0, 1.05 * max(float(values[-1]) for _, _, values in curves)), ylim=(0, 1.02))
    ax.legend(loc="lower right")
    caption = "One curve per variant over its measured requests; dots: each one's median."
    return Plot(f"variants-{name.removesuffix('_ms')}-cdf", figure, caption)


@styled
def speed_quality(variants: list[VariantRun]) -> Plot | None:
    """Output tokens/s against perplexity, a marker per variant that measured quality (`quality:`
    in the spec), with the unquantised model's perplexity as a line: what a speed-up costs."""
    points = []
    for i, v in enumerate(variants):
        quality = v.run.summary.get("quality") if v.run is not None else None
        speed = v.run.summary.get("output_tok_per_s") if v.run is not None else None
        if quality and speed is not None:
            points.append((i, v.name, speed, quality["rows"][-1], quality["rows"][0]))
    if not points:
        return None
    figure, ax = new_axes(SMALL_IN, "Speed vs quality", "output tokens/s", "perplexity")
    reference = points[0][4]["perplexity"]
    ax.axhline(reference, color="#999999", linestyle="--", lw=1, label="unquantised")
    for i, label, speed, row, _ in points:
        y = row["perplexity"]
        mark = ax.scatter([speed], [y], s=30, color=_colour(i), zorder=3, label=label)
        hover(mark, [f"{label}: {speed:.1f} tok/s, perplexity {y:.3f}, KL {row['mean_kl']:.4f}"])
    ax.set_xlim(0, 1.15 * max(speed for _, _, speed, _, _ in points) or 1.0)
    ax.legend(loc="best")
    caption = (
        "Each marker is one variant: right is faster, up is worse quality; the dashed line is "
        "the unquantised model's perplexity on the same text."
    )
    return Plot("variants-speed-quality", figure, caption)


def figures(variants: list[VariantRun]) -> list[Plot]:
    """Every figure the variants have data for, in page order."""
    drawn = [
        speed_bars(variants),
        latency_cdfs(variants, "ttft_ms"),
        latency_cdfs(variants, "tpot_ms"),
        speed_quality(variants),
    ]
    return [plot for plot in drawn if plot is not None]
