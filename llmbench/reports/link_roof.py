"""The host-link roof of a run whose steps fetched offloaded weights over the link to the host:
its bandwidth, and each such step placed at its FLOPs per link byte (a second, hierarchical
roofline point beside the one at its FLOPs per memory byte).

The bandwidth is the simulated link's when the steps say their transfers were simulated
(Σ link_bytes / Σ link_s_simulated: the rate the simulation charged), else the datasheet's host
link of the run's device (`datasheets.HARDWARE[...]["host_link_bytes_per_s"]`); None without one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from matplotlib.axes import Axes

from llmbench.reports.figure import PURPLE, hover
from llmbench.reports.roofline_axes import draw_roof
from llmbench.reports.rundata import RunData
from llmbench.reports.tables import si
from llmbench.roofline import datasheets


@dataclass(frozen=True)
class LinkRoof:
    bytes_per_s: float
    label: str  # "host link (simulated)", "host link (datasheet H100-SXM)"
    is_simulated: bool


def link_roof(run: RunData) -> LinkRoof | None:
    """The run's host-link roof, or None when no step moved link bytes (or, on a real link, the
    device has no datasheet link bandwidth).

    Formula: simulated: Σ link_bytes / Σ link_s_simulated over the steps with a simulated time.
    """
    moved = [s for s in run.steps if s.get("link_bytes")]
    if not moved:
        return None
    simulated = [s for s in moved if s.get("link_s_simulated")]
    if simulated:
        seconds = sum(s["link_s_simulated"] for s in simulated)
        return LinkRoof(
            sum(s["link_bytes"] for s in simulated) / seconds, "host link (simulated)", True
        )
    sheet = ((run.results.get("roofline") or {}).get("datasheet_roofs") or {}).get("label", "")
    name = sheet.removeprefix("datasheet ")
    spec = datasheets.datasheet(name) if name else None
    if not spec or not spec.get("host_link_bytes_per_s"):
        return None
    return LinkRoof(spec["host_link_bytes_per_s"], f"host link (datasheet {name})", False)


def link_intensity(steps: list[tuple[int, dict[str, Any]]]) -> np.ndarray:
    """FLOPs per link byte of each (index, step); NaN for a step that moved no link bytes."""
    return np.array(
        [s["flops"] / s["link_bytes"] if s.get("link_bytes") else np.nan for _, s in steps]
    )


def draw_link(
    ax: Axes,
    roof: LinkRoof,
    flops_per_s: float | None,
    steps: list[tuple[int, dict[str, Any]]],
    achieved: np.ndarray,
) -> None:
    """The link roof (dash-dot, under the same FLOP/s ceiling) and the steps that crossed the
    link as hollow markers at their FLOPs per link byte, each with its link bytes on hover."""
    draw_roof(ax, roof.label, roof.bytes_per_s, flops_per_s, color=PURPLE, linestyle="-.")
    x = link_intensity(steps)
    chosen = np.flatnonzero(np.isfinite(x))
    marks = ax.scatter(
        x[chosen],
        achieved[chosen],
        s=22,
        facecolors="none",
        edgecolors=PURPLE,
        lw=0.8,
        clip_on=False,
        label=f"steps at FLOP per link byte ({len(chosen)})",
    )
    hover(
        marks,
        [
            f"{steps[k][1]['phase']} step {steps[k][0]}: {si(steps[k][1]['link_bytes'], 'B')} "
            f"over the link, {x[k]:.3g} FLOP per link byte"
            for k in chosen
        ],
    )
