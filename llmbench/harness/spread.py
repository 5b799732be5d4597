"""The between-repetition spread of a run's metrics: per metric, the mean, standard deviation and
coefficient of variation of its value over the repetitions' summaries (`summary.spread`).

A metric is named as a gates file names it: `tpot_ms.p50` is `summary["tpot_ms"]["p50"]`,
`decode_mbu` is `summary["decode_mbu"]`. Torch-free: results.py migrates older files with it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from llmbench.harness.metrics import LATENCY_FAMILIES, STATISTICS

# One number per repetition: the rates, goodput, roofline fractions and the prefix hit rate.
RUN_METRICS = (
    "output_tok_per_s",
    "input_tok_per_s",
    "request_per_s",
    "goodput_request_per_s",
    "goodput_fraction",
    "decode_mbu",
    "prefill_mfu",
    "prefix_cache_hit_rate",
)
SPREAD_METRICS = (
    # The latency distributions and the statistics a gate may name (no `max`: one slowest
    # request is not a property of the run).
    *(f"{m}.{s}" for m in LATENCY_FAMILIES for s in STATISTICS),
    *RUN_METRICS,
)


def metric_value(summary: Mapping[str, Any], name: str) -> float | None:
    """The value of metric `name` in a summary; None when the summary has none."""
    family, _, statistic = name.partition(".")
    value = summary.get(family)
    if statistic:
        value = value.get(statistic) if isinstance(value, Mapping) else None
    return value if isinstance(value, int | float) and not isinstance(value, bool) else None


def spread_of(values: Sequence[float]) -> dict[str, float | None]:
    """Mean, sample standard deviation and coefficient of variation of `values`.

    Formula: mean = Σx / n; stdev = √(Σ (x − mean)² / (n − 1)) (ddof = 1); cv = stdev / mean.
    stdev and cv are None for fewer than 2 values, cv also when the mean is 0; all three are
    None for no value.
    """
    n = len(values)
    if n == 0:
        return {"mean": None, "stdev": None, "cv": None}
    mean = sum(values) / n
    if n < 2:
        return {"mean": mean, "stdev": None, "cv": None}
    stdev = math.sqrt(sum((x - mean) ** 2 for x in values) / (n - 1))
    return {"mean": mean, "stdev": stdev, "cv": stdev / mean if mean else None}


def spread(summaries: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, float | None]]:
    """Every metric of `SPREAD_METRICS` → `spread_of` its values over the summaries that have
    one (a repetition without decode steps has no decode MBU)."""
    out = {}
    for name in SPREAD_METRICS:
        values = [v for v in (metric_value(s, name) for s in summaries) if v is not None]
        out[name] = spread_of(values)
    return out
