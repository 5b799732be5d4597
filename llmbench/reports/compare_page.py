"""The HTML diff of `llmbench compare --html`: both runs' roofline points overlaid in two colours,
their TTFT and TPOT CDFs overlaid, and the verdict table; a sweep gets a section per point.

One self-contained page like report.html (a jinja2 template, inline CSS and SVG, no script, no
URL), drawn from what the comparison read: each side's steps, requests and roofs.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from llmbench.compare.output import HEADER, gate_row
from llmbench.compare.runs import LoadedRun, RunPair
from llmbench.compare.verdict import Comparison, GateResult
from llmbench.harness.results import Roofs
from llmbench.reports.figure import BLUE, GREEN, ORANGE, RED, Plot, hover, new_axes, styled
from llmbench.reports.html_report import Page, render_page
from llmbench.reports.roofline_axes import draw_roof, draw_steps, log_axes

SIDES = ("BASE", "NEW")
SIDE_COLOURS = {"BASE": BLUE, "NEW": ORANGE}
PHASE_MARKERS = {"decode": "o", "prefill": "s", "mixed": "^"}
MAX_POINTS_PER_SIDE = 2000  # a longer run is thinned evenly
CDF_SIZE_IN = (4.6, 3.2)
QUANTILES = (50, 90, 99)
# The verdict cell's colour: what needs a look stands out.
VERDICT_STYLES = {
    "regression": f"color: {RED}; font-weight: 600",
    "improvement": f"color: {GREEN}; font-weight: 600",
    "inconclusive": f"color: {ORANGE}; font-weight: 600",
    "refused": f"color: {ORANGE}; font-weight: 600",
    "no data": "color: #59636e",
}


@dataclass(frozen=True)
class Section:
    """One comparison on the page: a sweep point's, or the only one."""

    label: str | None  # "point-4", None for two single runs
    warnings: list[str]
    sides: list[tuple[str, str]]  # (BASE / NEW, what and where it ran)
    header: tuple[str, ...]
    rows: list[tuple[list[str], str]]  # (cells, style of the verdict cell)
    plots: list[Plot]


def _key(prefix: str, name: str) -> str:
    """A figure id unique in the page, safe in an id and in url(#...)."""
    return re.sub(r"[^A-Za-z0-9-]", "_", f"{prefix}{name}")


def _timed_steps(run: LoadedRun) -> list[tuple[int, dict]]:
    """(index in steps.jsonl, step) of the points a roofline can place, thinned evenly."""
    steps = [
        (i, s)
        for i, s in enumerate(run.steps)
        if s["t_end_ns"] > s["t_start_ns"] and s["bytes"] > 0 and s["flops"] > 0
    ]
    stride = max(1, math.ceil(len(steps) / MAX_POINTS_PER_SIDE))
    return steps[::stride]


def _roofs(run: LoadedRun) -> Roofs | None:
    return run.result.roofline.roofs if run.result.roofline is not None else None


@styled
def roofline_overlay(prefix: str, baseline: LoadedRun, new: LoadedRun) -> Plot | None:
    """Log-log roofline with both runs' steps: BASE blue, NEW orange, marker by phase, size by
    batch; each side's measured roof (one line when they are the same)."""
    sides = {"BASE": (baseline, _timed_steps(baseline)), "NEW": (new, _timed_steps(new))}
    if not any(steps for _, steps in sides.values()):
        return None
    numbers = {}
    for side, (_, steps) in sides.items():
        seconds = np.array([(s["t_end_ns"] - s["t_start_ns"]) / 1e9 for _, s in steps])
        flops = np.array([s["flops"] for _, s in steps], dtype=float)
        intensity = flops / np.array([s["bytes"] for _, s in steps], dtype=float)
        numbers[side] = (seconds, intensity, flops / seconds)
    roofs = {side: _roofs(run) for side, (run, _) in sides.items()}
    known = [r for r in roofs.values() if r is not None]
    ridges = [r.flops_per_s / r.read_bytes_per_s for r in known if r.flops_per_s]
    figure, ax = new_axes(
        (6.4, 5.4),
        "Roofline: BASE vs NEW",
        "arithmetic intensity (FLOP/byte)",
        "achieved FLOP/s",
    )
    log_axes(
        ax,
        [*(x for _, i, _ in numbers.values() for x in i), *ridges, *(4 * x for x in ridges)],
        [*(y for _, _, a in numbers.values() for y in a), *(r.flops_per_s or 0 for r in known)],
    )
    peaks = {side: r and (r.read_bytes_per_s, r.flops_per_s) for side, r in roofs.items()}
    if peaks["BASE"] is not None and peaks["BASE"] == peaks["NEW"]:
        r = roofs["BASE"]
        draw_roof(ax, f"roof (both): {r.label}", r.read_bytes_per_s, r.flops_per_s)
    else:
        for side, style in (("BASE", {}), ("NEW", {"linestyle": "--"})):
            r = roofs[side]
            if r is not None:
                label = f"{side} roof"
                colour = SIDE_COLOURS[side]
                draw_roof(ax, label, r.read_bytes_per_s, r.flops_per_s, color=colour, **style)
    for side, (_, steps) in sides.items():
        seconds, intensity, achieved = numbers[side]
        for phase, marker in PHASE_MARKERS.items():
            num_drawn = sum(1 for _, s in steps if s["phase"] == phase)
            draw_steps(
                ax,
                steps,
                seconds,
                intensity,
                achieved,
                phase,
                f"{side} {phase} ({num_drawn} drawn)",
                name=f"{side} ",
                marker=marker,
                color=SIDE_COLOURS[side],
                alpha=0.55,
            )
    # Below the axes, where it hides no point (constrained layout makes room for it).
    legend = ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.14), ncols=2, frameon=False)
    for handle in legend.legend_handles:
        if hasattr(handle, "set_sizes"):
            handle.set_sizes([24])
    counts = ", ".join(f"{side} {len(steps)}" for side, (_, steps) in sides.items())
    caption = (
        f"Each point is one engine step ({counts} drawn): x = FLOPs / bytes the cost model says "
        "it computed and moved, y = FLOPs / its measured time. BASE blue, NEW orange; circles "
        "decode, squares prefill, triangles mixed; size grows with the sequences in the step. "
        "NEW's points below BASE's at the same intensity are slower steps."
    )
    return Plot(_key(prefix, "roofline"), figure, caption)


def _pooled(run: LoadedRun, family: str) -> np.ndarray:
    groups = [np.asarray(g, dtype=float) for g in run.samples.per_request.get(family, ())]
    values = np.concatenate(groups) if groups else np.array([])
    return np.sort(values[np.isfinite(values)])


@styled
def cdf_overlay(prefix: str, family: str, baseline: LoadedRun, new: LoadedRun) -> Plot | None:
    """Empirical CDFs of one latency (`ttft_ms`, `tpot_ms`) of both runs, the samples the gates
    judged (every repetition pooled), with dots at p50 / p90 / p99."""
    values = {"BASE": _pooled(baseline, family), "NEW": _pooled(new, family)}
    if not any(v.size for v in values.values()):
        return None
    name = family.removesuffix("_ms").upper()
    figure, ax = new_axes(CDF_SIZE_IN, f"{name} CDF: BASE vs NEW", f"{family} (ms)", "fraction")
    parts = []
    for side, xs in values.items():
        if not xs.size:
            parts.append(f"{side} has no samples")
            continue
        colour = SIDE_COLOURS[side]
        ax.ecdf(xs, color=colour, label=f"{side} ({xs.size} requests)")
        at = np.percentile(xs, QUANTILES)
        marks = ax.scatter(at, [q / 100 for q in QUANTILES], s=16, color=colour, zorder=3)
        hover(marks, [f"{side} p{q}: {v:.2f} ms" for q, v in zip(QUANTILES, at, strict=True)])
        parts.append(f"{side} p50 {at[0]:.1f} ms, p99 {at[2]:.1f} ms")
    top = max(v[-1] for v in values.values() if v.size)
    ax.set(xlim=(0, 1.05 * top or 1.0), ylim=(0, 1.02))
    ax.legend(loc="lower right")
    caption = "; ".join(parts) + " (dots: p50 / p90 / p99). A curve to the right is slower."
    return Plot(_key(prefix, f"{family.removesuffix('_ms')}-cdf"), figure, caption)


def _side_text(run: LoadedRun) -> str:
    p = run.result.provenance
    load = p.machine_load
    busy = f", machine busy ({load.other_processes_cores} cores used by others)"
    return (
        f"{run.path} · {run.samples.device} · git {p.git_sha or '-'} · "
        f"{run.num_repetitions} repetition{'s' if run.num_repetitions > 1 else ''}"
        + (busy if load.is_busy else "")
    )


def _warnings(pair: RunPair, comparison: Comparison) -> list[str]:
    out = []
    for side, run in zip(SIDES, (pair.baseline, pair.new), strict=True):
        if run.result.provenance.machine_load.is_busy:
            out.append(
                f"{side} ran on a busy machine: its numbers are pessimistic, and a regression "
                "is only inconclusive unless --allow-busy."
            )
        if run.result.interrupted:
            out.append(f"{side} was interrupted ({run.result.stop_reason}): partial results.")
    if comparison.baseline_device != comparison.new_device:
        out.append(
            f"Different devices ({comparison.baseline_device} vs {comparison.new_device}): raw "
            "times and rates are not gated unless --force-devices."
        )
    return out


def _rows(results: Sequence[GateResult]) -> list[tuple[list[str], str]]:
    return [([*gate_row(r), r.reason], VERDICT_STYLES.get(r.verdict, "")) for r in results]


def section(pair: RunPair, comparison: Comparison) -> Section:
    """One comparison's part of the page: warnings, both sides, verdicts, figures."""
    prefix = f"{pair.point}-" if pair.point else ""
    plots = [
        roofline_overlay(prefix, pair.baseline, pair.new),
        cdf_overlay(prefix, "ttft_ms", pair.baseline, pair.new),
        cdf_overlay(prefix, "tpot_ms", pair.baseline, pair.new),
    ]
    ci = f"{comparison.confidence * 100:g}% CI"
    return Section(
        label=pair.point,
        warnings=_warnings(pair, comparison),
        sides=[
            (side, _side_text(run))
            for side, run in zip(SIDES, (pair.baseline, pair.new), strict=True)
        ],
        header=(*HEADER[:4], ci, HEADER[5], "why"),
        rows=_rows(comparison.results),
        plots=[p for p in plots if p is not None],
    )


def _method(comparison: Comparison) -> str:
    """How the intervals were taken, for the subtitle."""
    if comparison.num_rounds is None:
        return "bootstrap intervals"
    return (
        f"paired bootstrap intervals over {comparison.num_rounds} rounds (each side's rounds "
        "pooled in the figures)"
    )


def render(compared: Sequence[tuple[RunPair, Comparison]]) -> Page:
    """The page of a whole comparison: one section per pair (per sweep point)."""
    sections = [section(pair, comparison) for pair, comparison in compared]
    failing = [pair.point or "the run" for pair, c in compared if c.has_regression]
    unusable = [pair.point or "the run" for pair, c in compared if c.is_unusable]
    verdict, where = ("REGRESSION", failing) if failing else ("NO VERDICT", unusable)
    if not where:
        verdict = "no regression"
    elif compared[0][0].point is not None:
        verdict += f" at {', '.join(where)}"
    first = compared[0][1]
    return render_page(
        "compare.html.j2",
        [plot for s in sections for plot in s.plots],
        title=f"{first.command}: {verdict}",
        subtitle=f"BASE in blue, NEW in orange · {first.confidence * 100:g}% {_method(first)}, "
        f"{first.num_resamples} resamples, seed {first.seed}",
        sections=sections,
    )
