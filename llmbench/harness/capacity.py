"""How much load meets the SLOs: when a point of a sweep met them, and where `load.search` runs
its next point.

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
from collections.abc import Mapping
from typing import Any

from llmbench.harness.spec import LoadSearch

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
