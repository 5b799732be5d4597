"""How much load meets the SLOs: when a point of a sweep met them, the sweep's answer
(`capacity_line`), and where `load.search` runs its next point.

A point met its SLOs when at least `SLO_ATTAINMENT` of its measured requests met every one of
them (`summary.goodput_fraction`; the attainment DistServe takes goodput at). A search runs its
`low` load first (if that misses, nothing lower is tried: it says so), then its `high` (if that
meets them, the edge lies past it), then, until it has run `points` loads, the geometric middle
of the highest load that met them and the lowest above it that did not: rates and concurrencies
both span orders of magnitude, so the middle is taken on a log scale. Concurrencies are whole
numbers; rates keep 3 significant digits (a point's folder is `point-<value>/`). A search ends
early when the two loads are next to each other: concurrencies 1 apart, rates within 5%.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from llmbench.harness.spec import LoadSearch

if TYPE_CHECKING:  # type hints only
    from llmbench.harness.results import RunResult

SLO_ATTAINMENT = 0.9
CLOSE_ENOUGH = 1.05  # rates: the search ends when the lowest miss is within 5% of the best hit


def meets_slos(summary: Mapping[str, Any]) -> bool:
    """Whether a point's requests met the SLOs: at least SLO_ATTAINMENT of them met every one."""
    return (summary.get("goodput_fraction") or 0.0) >= SLO_ATTAINMENT


def next_load(search: LoadSearch, met: Mapping[float, bool], whole: bool) -> float | None:
    """The load the search runs next, given whether each load run so far met the SLOs; None
    once it is done. `whole`: concurrencies (whole numbers)."""
    if len(met) >= search.points:
        return None
    if search.low not in met:
        return search.low
    if not met[search.low]:
        return None  # the edge lies below the range
    if search.high not in met:
        return search.high
    if met[search.high]:
        return None  # the edge lies past the range
    best = max(load for load, ok in met.items() if ok and load < search.high)
    miss = min(load for load, ok in met.items() if not ok and load > best)
    middle = math.sqrt(best * miss)
    if whole:
        middle = float(round(middle))
        return None if middle in (best, miss) else middle
    middle = float(f"{middle:.3g}")
    return None if miss <= best * CLOSE_ENOUGH or middle in (best, miss) else middle


def slo_limits(result: RunResult) -> dict[str, float]:
    """A run's SLOs (`spec.slo`: metric → limit in ms); {} without."""
    return dict(result.spec.get("slo") or {})


def capacity_line(points: Sequence[RunResult]) -> str | None:
    """With SLOs, a sweep's (or search's) answer to "how much load meets them": the highest
    point that met them (`meets_slos`), and whether the edge lies past the highest load tried;
    or that none did and which came closest. None without SLOs or points."""
    limits = slo_limits(points[0]) if points else {}
    if not limits:
        return None
    slos = ", ".join(f"{metric} ≤ {limit:g}" for metric, limit in limits.items())
    share = f"{SLO_ATTAINMENT:.0%}"
    by_concurrency = (points[0].spec.get("load") or {}).get("kind") == "concurrency"

    def load(point: RunResult) -> str:
        value = point.sweep_point or 0.0
        return f"concurrency {value:g}" if by_concurrency else f"{value:g} requests/s"

    def met(point: RunResult) -> float:
        return point.summary.get("goodput_fraction") or 0.0

    def value(point: RunResult) -> float:
        return point.sweep_point or 0.0

    passing = [point for point in points if meets_slos(point.summary)]
    if not passing:
        best = max(points, key=met)
        return (
            f"no point met the SLOs ({slos}) for {share} of its requests; the closest: "
            f"{load(best)} ({met(best):.1%})"
        )
    top = max(passing, key=value)
    goodput = top.summary.get("goodput_request_per_s")
    shown = "-" if goodput is None else f"{goodput:,.2f}"
    edge = "; the highest tried: the edge lies past it" if top is max(points, key=value) else ""
    return (
        f"highest load that met the SLOs ({slos}) for {share} of its requests: {load(top)}, "
        f"{shown} good req/s ({met(top):.1%} met){edge}"
    )
