"""The verdict of an interleaved A/B run (`llmbench ab`): every gated metric measured once per
round on each side, the rounds paired, the change judged on the pairs.

Formula: round r gives b_r (BASE) and n_r (NEW) for a metric — the statistic over that round's
requests for a latency (its p50, p90, … or mean), the mean of its repetitions for a rate or a
roofline fraction. Over the rounds where both sides measured it, the change is
delta = mean(n) / mean(b) − 1. Its interval is a paired bootstrap: the rounds are drawn with
replacement, the same rounds for both sides, so what moved both sides of a round (the machine
drifting, a neighbour waking up) cancels, and what is left is the difference between the sides
within a round. A percentile bootstrap over a handful of rounds is too narrow, so its tails are
widened as in Hesterberg's expanded percentile interval (2015): the tail level α' is the one
with z(α'/2) = √(n/(n−1))·t(α/2, n−1), which gives it the width of a paired t interval at n
rounds. The verdicts are those of `compare` (`verdict.judge`): a regression only when the whole
interval lies past the gate's threshold.
"""

from __future__ import annotations

import math
import statistics
import zlib
from collections.abc import Sequence

import numpy as np

from llmbench.compare.gates import Gate, MetricInfo
from llmbench.compare.verdict import (
    Comparison,
    MetricDelta,
    RunSamples,
    bootstrap_repetition_means,
    judge,
    relative_change,
)

# A paired interval needs the spread of the pairs: two rounds at the least, three to say much.
MIN_ROUNDS = 2


def t_quantile(probability: float, df: int) -> float:
    """The two-sided quantile of Student's t with `df` degrees of freedom: the t with
    P(|T| <= t) = `probability` (0.95 → 2.776 at df 4). Exact: the closed-form distribution for
    integer df (Abramowitz & Stegun 26.7.3), inverted by bisection."""
    if df < 1 or not 0 < probability < 1:
        raise ValueError(f"need df >= 1 and 0 < probability < 1, got {df}, {probability}")
    low, high = 0.0, 1.0
    while _t_central_mass(high, df) < probability:
        high *= 2
    for _ in range(200):
        middle = (low + high) / 2
        if _t_central_mass(middle, df) < probability:
            low = middle
        else:
            high = middle
        if high - low <= 1e-12 * high:
            break
    return (low + high) / 2


def _t_central_mass(t: float, df: int) -> float:
    """P(|T| <= t) for Student's t with integer `df` (A&S 26.7.3): θ = atan(t/√df);
    even df: sin θ · Σ_{k=0}^{df/2−1} c_k cos^{2k} θ with c_0 = 1, c_k = c_{k−1}(2k−1)/(2k);
    odd df: (2/π)(θ + sin θ · Σ_{k=1}^{(df−1)/2} d_k cos^{2k−1} θ) with d_1 = 1,
    d_k = d_{k−1}(2k−2)/(2k−1) (no sum at df 1)."""
    theta = math.atan(t / math.sqrt(df))
    sin, cos2 = math.sin(theta), math.cos(theta) ** 2
    if df % 2 == 0:
        term = total = 1.0
        for k in range(2, df - 1, 2):  # the factor (k−1)/k of each next power of cos²
            term *= (k - 1) / k * cos2
            total += term
        return sin * total
    if df == 1:
        return 2 * theta / math.pi
    term = total = math.cos(theta)
    for k in range(3, df - 1, 2):
        term *= (k - 1) / k * cos2
        total += term
    return 2 / math.pi * (theta + sin * total)


def expanded_tails(confidence: float, num_rounds: int) -> tuple[float, float]:
    """The percentiles (0–100) that bound a paired bootstrap interval over `num_rounds` rounds:
    Hesterberg's expanded percentile interval, α'/2 = Φ(−√(n/(n−1)) · t(confidence, n−1))."""
    n = num_rounds
    widened = math.sqrt(n / (n - 1)) * t_quantile(confidence, n - 1)
    tail = 100 * statistics.NormalDist().cdf(-widened)
    return tail, 100 - tail


def round_value(samples: RunSamples, info: MetricInfo) -> float | None:
    """One side's value of a metric in one round: the statistic over the round's requests (all
    its repetitions pooled), or the mean of its repetitions; None where it measured nothing."""
    if info.is_per_request:
        pooled = [x for rep in samples.per_request.get(info.family, ()) for x in rep if _finite(x)]
        if not pooled:
            return None
        if info.statistic == "mean":
            return float(np.mean(pooled))
        return float(np.percentile(pooled, float(info.statistic[1:]), method="linear"))
    values = [x for x in samples.per_repetition.get(info.family, ()) if _finite(x)]
    return float(np.mean(values)) if values else None


def _finite(x: float | None) -> bool:
    return x is not None and math.isfinite(x)


def measure_paired(
    rounds: Sequence[tuple[RunSamples, RunSamples]],
    info: MetricInfo,
    *,
    seed: int = 0,
    num_resamples: int = 10_000,
    confidence: float = 0.95,
) -> MetricDelta:
    """The change of one metric over paired rounds (BASE, NEW), with its expanded paired
    bootstrap interval (see the module docstring), over the rounds where both sides measured it;
    fewer than `MIN_ROUNDS` such pairs give the change without an interval. `new_low`/`new_high`
    bound the mean of NEW over the rounds it measured (what `min` / `max` gates judge), the same
    way; `baseline` and `new` are the means over the pairs (over a side's rounds without any)."""
    base_values = [round_value(base, info) for base, _ in rounds]
    new_values = [round_value(new, info) for _, new in rounds]
    pairs = [(b, n) for b, n in zip(base_values, new_values, strict=True) if None not in (b, n)]
    rng = np.random.default_rng([seed, zlib.crc32(info.name.encode())])
    new_low, new_high = _interval_of_mean(
        [v for v in new_values if v is not None], rng, confidence, num_resamples
    )
    delta = delta_low = delta_high = None
    if pairs:
        b = np.array([p[0] for p in pairs])
        n = np.array([p[1] for p in pairs])
        base_mean, new_mean = float(b.mean()), float(n.mean())
        if base_mean != 0:
            delta = new_mean / base_mean - 1
        if len(pairs) >= MIN_ROUNDS and base_mean != 0:
            draws = rng.integers(0, len(pairs), size=(num_resamples, len(pairs)))
            deltas = relative_change(n[draws].mean(axis=1), b[draws].mean(axis=1))
            tails = expanded_tails(confidence, len(pairs))
            delta_low, delta_high = (float(x) for x in np.percentile(deltas, tails))
    else:
        base_mean, new_mean = _mean_of_present(base_values), _mean_of_present(new_values)
    return MetricDelta(
        metric=info.name,
        baseline=base_mean,
        new=new_mean,
        delta=delta,
        delta_low=delta_low,
        delta_high=delta_high,
        new_low=new_low,
        new_high=new_high,
        num_baseline_repetitions=sum(v is not None for v in base_values),
        num_new_repetitions=sum(v is not None for v in new_values),
    )


def _interval_of_mean(
    values: Sequence[float], rng: np.random.Generator, confidence: float, num_resamples: int
) -> tuple[float | None, float | None]:
    """The expanded percentile bootstrap interval of the mean of `values` (one per round);
    (None, None) with fewer than `MIN_ROUNDS` values."""
    if len(values) < MIN_ROUNDS:
        return None, None
    means = bootstrap_repetition_means(np.array(values), num_resamples, rng)
    low, high = np.percentile(means, expanded_tails(confidence, len(values)))
    return float(low), float(high)


def _mean_of_present(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return float(np.mean(present)) if present else None


def compare_paired(
    rounds: Sequence[tuple[RunSamples, RunSamples]],
    gates: Sequence[Gate],
    *,
    allow_busy: bool = False,
    force_devices: bool = False,
    allow_missing: bool = False,
    seed: int = 0,
    num_resamples: int = 10_000,
    confidence: float = 0.95,
) -> Comparison:
    """Every gate judged on the paired rounds (BASE, NEW) of an A/B run, as `compare` judges
    two runs: the same verdicts, refusals and busy rule (a round on a busy machine makes a
    regression inconclusive unless `allow_busy`)."""
    base_device = _device([base for base, _ in rounds])
    new_device = _device([new for _, new in rounds])
    is_base_busy = any(base.is_busy for base, _ in rounds)
    is_new_busy = any(new.is_busy for _, new in rounds)
    results = []
    for gate in gates:
        numbers = measure_paired(
            rounds, gate.info, seed=seed, num_resamples=num_resamples, confidence=confidence
        )
        results.append(
            judge(
                gate,
                numbers,
                is_busy=is_base_busy or is_new_busy,
                allow_busy=allow_busy,
                devices=(base_device, new_device),
                force_devices=force_devices,
                confidence=confidence,
            )
        )
    return Comparison(
        results=tuple(results),
        baseline_device=base_device,
        new_device=new_device,
        is_baseline_busy=is_base_busy,
        is_new_busy=is_new_busy,
        confidence=confidence,
        num_resamples=num_resamples,
        seed=seed,
        allow_missing=allow_missing,
        num_rounds=len(rounds),
    )


def _device(sides: Sequence[RunSamples]) -> str:
    """The device of one side over its rounds: one name, or each one seen, in order."""
    return " / ".join(dict.fromkeys(s.device for s in sides))
