"""Noise-aware comparison of two runs: the change in each gated metric, its bootstrap confidence
interval, and a verdict per gate.

Each side gives its samples repetition by repetition: per-request values for latencies, one value
per repetition for rates and roofline fractions. The change of a metric is
delta = (new − baseline) / baseline, and its 95% interval comes from a seeded bootstrap that
resamples the repetitions and, inside each, the requests. A gate calls a regression only when the
whole interval lies past its threshold, an improvement only when the whole interval lies past it
the other way, and "within noise" otherwise; `min` / `max` gates judge the interval of the new
value. A per-repetition metric (a rate, MBU, MFU) from a side with one repetition has no interval
(one value has no spread to resample): its gate judges the change itself and says so. A
regression measured on a busy machine is only inconclusive, and raw time/rate metrics are not
compared between different devices unless forced.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from llmbench.compare.gates import Gate, MetricInfo, format_percent

Verdict = Literal[
    "regression",  # the whole interval lies past the gate's threshold, the bad way
    "improvement",  # the whole interval lies past the threshold the good way
    "within noise",  # the interval straddles the threshold
    "pass",  # min / max gate: the whole interval of the new value is inside the limit
    "inconclusive",  # a regression, but measured on a busy machine
    "refused",  # a raw time/rate compared between different devices
    "no data",  # a side did not measure the metric, or the baseline is 0
]
FAILING: tuple[Verdict, ...] = ("regression",)
# Gates that gave no verdict at all. A comparison with one is not a pass ("no silent pass"):
# `compare` exits 2 naming each, unless the caller allows missing verdicts.
WITHOUT_VERDICT: tuple[Verdict, ...] = ("refused", "no data")
# What to do about each, for the line that names the gate.
WHAT_TO_PASS = {
    "refused": "pass --force-devices to compare raw numbers across devices, or gate a "
    "hardware-normalised metric",
    "no data": "measure it in both runs, leave the gate out of --gates, or pass --allow-missing",
}

# Resampled values held at once per side: bounds memory (≈ 8 bytes × 3 arrays × this).
_CHUNK_VALUES = 2_000_000


@dataclass(frozen=True)
class RunSamples:
    """One side of a comparison: what it measured, repetition by repetition.

    `per_request[family]` holds one sequence of per-request values per repetition (latency
    families such as "tpot_ms"); `per_repetition[metric]` one value per repetition (rates, MBU,
    MFU, hit rate). None and non-finite values are dropped, and so is a repetition left empty.
    """

    per_request: Mapping[str, Sequence[Sequence[float]]]
    per_repetition: Mapping[str, Sequence[float | None]]
    device: str  # provenance.device: raw metrics are compared within one device unless forced
    is_busy: bool = False  # the run was flagged machine_busy


@dataclass(frozen=True)
class MetricDelta:
    """The numbers of one metric on both sides. `delta*` are fractions (0.2 = +20%); `new_low`,
    `new_high` bound the new value itself, in the metric's unit. None where a side has no data;
    the bounds alone are None where there is no interval (`has_delta_interval`,
    `has_new_interval`)."""

    metric: str
    baseline: float | None
    new: float | None
    delta: float | None
    delta_low: float | None
    delta_high: float | None
    new_low: float | None
    new_high: float | None
    num_baseline_repetitions: int
    num_new_repetitions: int

    @property
    def has_delta_interval(self) -> bool:
        """False when the change is known but has no interval: a per-repetition metric with a
        single repetition on a side."""
        return self.delta is None or self.delta_low is not None

    @property
    def has_new_interval(self) -> bool:
        """False when the new value is known but has no interval (a single repetition)."""
        return self.new is None or self.new_low is not None


NO_INTERVAL = "1 repetition: no interval"


@dataclass(frozen=True)
class GateResult:
    gate: Gate
    numbers: MetricDelta
    verdict: Verdict
    reason: str  # one line for people: what was measured against what

    @property
    def is_failing(self) -> bool:
        return self.verdict in FAILING


@dataclass(frozen=True)
class Comparison:
    results: tuple[GateResult, ...]  # one per gate, in the gates' order
    baseline_device: str
    new_device: str
    is_baseline_busy: bool
    is_new_busy: bool
    confidence: float
    num_resamples: int
    seed: int
    allow_missing: bool = False  # refused and no-data gates do not make it unusable
    num_rounds: int | None = None  # an A/B run's paired rounds (`paired`); None: two runs

    @property
    def command(self) -> str:
        """The command that judged it, as its outputs name it."""
        return "llmbench compare" if self.num_rounds is None else "llmbench ab"

    @property
    def regressions(self) -> tuple[GateResult, ...]:
        return tuple(r for r in self.results if r.is_failing)

    @property
    def has_regression(self) -> bool:
        return bool(self.regressions)

    @property
    def without_verdict(self) -> tuple[GateResult, ...]:
        """The gates that were refused or had no data."""
        return tuple(r for r in self.results if r.verdict in WITHOUT_VERDICT)

    @property
    def is_unusable(self) -> bool:
        """No regression can be ruled out: a gate gave no verdict (or there were no gates),
        and missing verdicts were not allowed."""
        if self.allow_missing:
            return False
        return not self.results or bool(self.without_verdict)


# -- bootstrap ---------------------------------------------------------------------------------


def _statistics(values: np.ndarray, statistics: Sequence[str]) -> np.ndarray:
    """Each statistic of each row of `values`: [..., n] → [len(statistics), ...]. "mean", or
    "pXX": numpy's linear percentile, the one the run summary uses (all in one partition)."""
    out = np.empty((len(statistics), *values.shape[:-1]))
    wanted = [(i, float(s[1:])) for i, s in enumerate(statistics) if s != "mean"]
    if wanted:
        rows, qs = zip(*wanted, strict=True)
        out[list(rows)] = np.percentile(values, qs, axis=-1, method="linear")
    for i, statistic in enumerate(statistics):
        if statistic == "mean":
            out[i] = values.mean(axis=-1)
    return out


def bootstrap_per_request(
    repetitions: Sequence[np.ndarray],
    statistics: Sequence[str],
    num_resamples: int,
    rng: np.random.Generator,
) -> np.ndarray:
    """[len(statistics), num_resamples] resampled statistics of pooled per-request samples.

    Two stages per resample: draw R repetitions with replacement, then inside the j-th drawn
    repetition draw as many requests as the original j-th repetition holds, with replacement;
    the statistic is taken over the pooled draws (the pooled size stays Σ n_r). With one
    repetition it is the plain bootstrap of the requests.

    Why both stages: repetitions carry the run-to-run drift (a busy neighbour, a warm cache)
    that requests alone would hide. The price: request noise is counted twice (it is already in
    each repetition's level), so when requests vary much more than repetitions the interval is
    up to √2 too wide, erring towards "within noise"; with only 3 repetitions the run-to-run
    part is under-estimated, so thresholds should exceed the run-to-run spread.
    """
    sizes = np.array([len(r) for r in repetitions], dtype=np.int64)
    offsets = np.concatenate(([0], np.cumsum(sizes)[:-1]))
    flat = np.concatenate(repetitions)
    slot = np.repeat(np.arange(len(sizes)), sizes)  # [N]: original repetition of each position
    out = np.empty((len(statistics), num_resamples))
    chunk = max(1, _CHUNK_VALUES // flat.size)
    for start in range(0, num_resamples, chunk):
        b = min(chunk, num_resamples - start)
        chosen = rng.integers(0, len(sizes), size=(b, len(sizes)))[:, slot]  # [b, N] repetition
        index = offsets[chosen] + (rng.random((b, flat.size)) * sizes[chosen]).astype(np.int64)
        values = flat[index]  # [b, N]
        out[:, start : start + b] = _statistics(values, statistics)
    return out


def bootstrap_repetition_means(
    values: np.ndarray, num_resamples: int, rng: np.random.Generator
) -> np.ndarray:
    """[num_resamples] means of the per-repetition values drawn with replacement."""
    draws = rng.integers(0, values.size, size=(num_resamples, values.size))
    return values[draws].mean(axis=1)


def _rng(seed: int, family: str, side: int) -> np.random.Generator:
    """One stream per (seed, metric family, side): adding a gate never moves another's interval."""
    return np.random.default_rng([seed, zlib.crc32(family.encode()), side])


def _clean(values: Sequence[float | None]) -> np.ndarray:
    xs = np.array(values, dtype=np.float64)  # None → nan
    return xs[np.isfinite(xs)]


def _side_draws(
    samples: RunSamples,
    infos: Sequence[MetricInfo],
    num_resamples: int,
    rng: np.random.Generator,
) -> tuple[np.ndarray, np.ndarray | None, int] | None:
    """(point estimates [M], resampled values [M, B], repetitions used) for metrics of one
    family on one side, or None when the side has no data for it. The resampled values are
    None for a per-repetition metric with one repetition: resampling one value gives that value
    back every time, a zero-width interval that would read as certainty."""
    family = infos[0].family
    if infos[0].is_per_request:
        reps = [_clean(r) for r in samples.per_request.get(family, ())]
        reps = [r for r in reps if r.size]
        if not reps:
            return None
        stats = [info.statistic for info in infos]
        pooled = np.concatenate(reps)
        points = _statistics(pooled, stats)
        return points, bootstrap_per_request(reps, stats, num_resamples, rng), len(reps)
    values = _clean(samples.per_repetition.get(family, ()))
    if not values.size:
        return None
    if values.size == 1:
        return values.copy(), None, 1
    draws = bootstrap_repetition_means(values, num_resamples, rng)
    return np.array([values.mean()]), draws[None, :], int(values.size)


def relative_change(new: np.ndarray, base: np.ndarray) -> np.ndarray:
    """(new − base) / base; a zero base gives +inf when new is above it, else 0."""
    with np.errstate(divide="ignore", invalid="ignore"):
        delta = (new - base) / base
    return np.where(base != 0, delta, np.where(new > base, np.inf, 0.0))


def measure(
    baseline: RunSamples,
    new: RunSamples,
    infos: Sequence[MetricInfo],
    *,
    seed: int = 0,
    num_resamples: int = 1000,
    confidence: float = 0.95,
) -> dict[str, MetricDelta]:
    """Baseline, new, delta and bootstrap intervals for each metric, gated or not.

    Formula: delta = (stat(new) − stat(base)) / stat(base), stat over the pooled repetitions
    (a percentile or mean of the requests; the mean of per-repetition values); the interval is
    the [(1 − c)/2, (1 + c)/2] percentiles of the same delta over resampled pairs (each side
    resampled independently), and new_low/new_high the same percentiles of stat(new). A
    per-repetition metric with one repetition on a side has no interval: its bounds are None.
    """
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    tails = (100 * (1 - confidence) / 2, 100 * (1 + confidence) / 2)
    families: dict[str, list[MetricInfo]] = {}
    for info in infos:
        if info not in families.setdefault(info.family, []):
            families[info.family].append(info)
    out: dict[str, MetricDelta] = {}
    for family, members in families.items():
        base = _side_draws(baseline, members, num_resamples, _rng(seed, family, 0))
        cur = _side_draws(new, members, num_resamples, _rng(seed, family, 1))
        for i, info in enumerate(members):
            base_value = None if base is None else float(base[0][i])
            new_value = None if cur is None else float(cur[0][i])
            new_low = new_high = delta = delta_low = delta_high = None
            if cur is not None and cur[1] is not None:
                new_low, new_high = (float(x) for x in np.percentile(cur[1][i], tails))
            if base is not None and cur is not None and base_value != 0:
                delta = (new_value - base_value) / base_value
                if base[1] is not None and cur[1] is not None:
                    deltas = relative_change(cur[1][i], base[1][i])
                    delta_low, delta_high = (float(x) for x in np.percentile(deltas, tails))
            out[info.name] = MetricDelta(
                metric=info.name,
                baseline=base_value,
                new=new_value,
                delta=delta,
                delta_low=delta_low,
                delta_high=delta_high,
                new_low=new_low,
                new_high=new_high,
                num_baseline_repetitions=0 if base is None else base[2],
                num_new_repetitions=0 if cur is None else cur[2],
            )
    return out


# -- verdicts ----------------------------------------------------------------------------------


def _percent_range(low: float, high: float) -> str:
    return f"{low * 100:+.1f}% to {high * 100:+.1f}%"


def judge(
    gate: Gate,
    numbers: MetricDelta,
    *,
    is_busy: bool = False,
    allow_busy: bool = False,
    devices: tuple[str, str] | None = None,
    force_devices: bool = False,
    confidence: float = 0.95,
) -> GateResult:
    """The verdict of one gate on one metric's numbers.

    Relative gates (threshold t, a fraction): max_increase is a regression when
    delta_low > t and an improvement when delta_high < −t; max_decrease is a regression when
    delta_high < −t and an improvement when delta_low > t; otherwise within noise (an interval
    ending exactly at the threshold is not past it). Absolute gates judge [new_low, new_high]:
    min is a regression when new_high < min and passes when new_low >= min; max is a regression
    when new_low > max and passes when new_high <= max. Without an interval (one repetition of
    a per-repetition metric) both ends are the value itself and the reason says there is no
    interval. `devices` = (baseline, new): a relative gate on a raw metric between two
    different devices is refused unless `force_devices`. A
    regression with `is_busy` (either side ran on a busy machine) is inconclusive unless
    `allow_busy`.
    """
    info = gate.info
    level = f"{confidence * 100:g}% CI"
    if numbers.new is None:
        return GateResult(gate, numbers, "no data", f"{gate.metric} was not measured by NEW")
    if gate.is_relative:
        if numbers.baseline is None:
            return GateResult(gate, numbers, "no data", f"{gate.metric} was not measured by BASE")
        if numbers.delta is None:
            reason = f"{gate.metric} is 0 in BASE: a relative change is undefined"
            return GateResult(gate, numbers, "no data", reason)
        is_other_device = devices is not None and devices[0] != devices[1]
        if is_other_device and not info.is_portable and not force_devices:
            reason = (
                f"{gate.metric} is a raw {'time' if info.is_lower_better else 'rate'}: not "
                f"compared between devices ({devices[0]} vs {devices[1]}) unless forced; gate a "
                "hardware-normalised metric (decode_mbu, prefill_mfu, output_tok_per_s_per_gb_s)"
            )
            return GateResult(gate, numbers, "refused", reason)
        t = gate.threshold
        if numbers.has_delta_interval:
            low, high = numbers.delta_low, numbers.delta_high
            interval = f"{level} {_percent_range(low, high)}"
        else:
            low = high = numbers.delta
            interval = NO_INTERVAL
        sign = 1 if gate.rule == "max_increase" else -1  # the bad direction
        worse, better = ("rose", "fell") if sign > 0 else ("fell", "rose")
        change = f"{gate.metric} changed {numbers.delta * 100:+.1f}% ({interval})"
        if (low > t) if sign > 0 else (high < -t):
            verdict: Verdict = "regression"
            reason = f"{gate.metric} {worse} {abs(numbers.delta) * 100:.1f}% ({interval}), "
            reason += f"past the {format_percent(t)} allowed"
        elif (high < -t) if sign > 0 else (low > t):
            verdict = "improvement"
            reason = f"{gate.metric} {better} {abs(numbers.delta) * 100:.1f}% ({interval}), "
            reason += f"past {format_percent(t)}"
        else:
            verdict = "within noise"
            reason = f"{change}: not wholly past ±{format_percent(t)}"
    else:
        unit = "" if info.unit == "fraction" else f" {info.unit}"
        if numbers.has_new_interval:
            low, high = numbers.new_low, numbers.new_high
            interval = f"{level} {low:.4g} to {high:.4g}{unit}"
        else:
            low = high = numbers.new
            interval = NO_INTERVAL
        value = f"{gate.metric} = {numbers.new:.4g} ({interval})"
        limit = f"{'floor' if gate.rule == 'min' else 'ceiling'} {gate.threshold:g}"
        if (high < gate.threshold) if gate.rule == "min" else (low > gate.threshold):
            verdict = "regression"
            reason = f"{value}: wholly {'below' if gate.rule == 'min' else 'above'} the {limit}"
        elif (low >= gate.threshold) if gate.rule == "min" else (high <= gate.threshold):
            verdict, reason = "pass", f"{value}: within the {limit}"
        else:
            verdict, reason = "within noise", f"{value}: straddles the {limit}"
    if verdict == "regression" and is_busy and not allow_busy:
        verdict = "inconclusive"
        reason += "; measured on a busy machine, so not called a regression unless allowed"
    return GateResult(gate, numbers, verdict, reason)


def compare(
    baseline: RunSamples,
    new: RunSamples,
    gates: Sequence[Gate],
    *,
    allow_busy: bool = False,
    force_devices: bool = False,
    allow_missing: bool = False,
    seed: int = 0,
    num_resamples: int = 1000,
    confidence: float = 0.95,
) -> Comparison:
    """Every gate judged on BASE vs NEW (see `measure` for the numbers, `judge` for verdicts);
    `allow_missing`: refused and no-data gates leave the comparison usable."""
    numbers = measure(
        baseline,
        new,
        [g.info for g in gates],
        seed=seed,
        num_resamples=num_resamples,
        confidence=confidence,
    )
    is_busy = baseline.is_busy or new.is_busy
    results = tuple(
        judge(
            gate,
            numbers[gate.metric],
            is_busy=is_busy,
            allow_busy=allow_busy,
            devices=(baseline.device, new.device),
            force_devices=force_devices,
            confidence=confidence,
        )
        for gate in gates
    )
    return Comparison(
        results=results,
        baseline_device=baseline.device,
        new_device=new.device,
        is_baseline_busy=baseline.is_busy,
        is_new_busy=new.is_busy,
        confidence=confidence,
        num_resamples=num_resamples,
        seed=seed,
        allow_missing=allow_missing,
    )
