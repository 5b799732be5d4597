"""`llmbench compare --history DIR`: where, over a history of runs of one spec, each gated metric
shifted — E-Divisive means change points (Matteson & James 2014, as Apache Otava / Hunter and
MongoDB use it on their performance histories).

A metric's series is one value per run, oldest first. For a segment x[0:n] split at τ into
X = x[0:τ] (m = τ values) and Y = x[τ:n] (k = n − τ values), the energy statistic is

    Formula: Q(τ) = m·k / (m + k) · Ê,  where
             Ê = 2/(m·k) Σ_ij |X_i − Y_j|
                 − 1/C(m,2) Σ_i<i' |X_i − X_i'| − 1/C(k,2) Σ_j<j' |Y_j − Y_j'|

(Ê: the energy distance between the two sides, with exponent α = 1; it is 0 when both sides
come from one distribution and grows with the gap between them). The best split of a segment is
the τ with the largest Q, both sides at least `min_size` long; it is significant when a
permutation test says so: p = (1 + #{permutations whose best Q ≥ Q}) / (1 + R) over R seeded
shuffles of the segment, significant when p ≤ `alpha`. A significant split cuts the segment in
two and each side is searched again (a divisive search), until no segment splits.

Each block sum comes from a 2-D prefix sum of the distance matrix, so one scan of a segment of n
values is O(n²) and a test of R permutations O(R·n²): 200 runs and 199 permutations are ~8 M adds.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from llmbench.compare.gates import Gate, MetricInfo
from llmbench.compare.runs import LoadedRun, default_gates_of, differences, load_side
from llmbench.errors import UserError

MIN_SIZE = 3  # runs on each side of a split: fewer cannot tell a shift from one noisy run
NUM_PERMUTATIONS = 199
ALPHA = 0.05


# -- the change-point search ---------------------------------------------------------------------


def split_statistics(values: np.ndarray, min_size: int = MIN_SIZE) -> np.ndarray:
    """Q(τ) for τ = min_size … n − min_size (the Formula above), as an array in that order."""
    n = values.size
    distances = np.abs(values[:, None] - values[None, :])  # [n, n]
    prefix = np.zeros((n + 1, n + 1))
    prefix[1:, 1:] = distances.cumsum(0).cumsum(1)  # prefix[i, j] = Σ distances[:i, :j]
    tau = np.arange(min_size, n - min_size + 1)
    m, k = tau.astype(float), (n - tau).astype(float)
    within_x = prefix[tau, tau]  # every pair of X twice
    between = prefix[tau, n] - within_x
    within_y = prefix[n, n] - prefix[tau, n] - prefix[n, tau] + within_x
    energy = 2 * between / (m * k) - within_x / (m * (m - 1)) - within_y / (k * (k - 1))
    return m * k / (m + k) * energy


@dataclass(frozen=True)
class Split:
    """A significant split: the series' index where the new segment begins, its Q and p."""

    index: int
    statistic: float
    p_value: float


def best_split(
    values: np.ndarray,
    *,
    min_size: int = MIN_SIZE,
    num_permutations: int = NUM_PERMUTATIONS,
    rng: np.random.Generator,
) -> Split | None:
    """The split of one segment with the largest Q and its permutation p-value; None when the
    segment is too short to split (fewer than 2 · min_size values)."""
    if values.size < 2 * min_size:
        return None
    statistics = split_statistics(values, min_size)
    best = int(np.argmax(statistics))
    observed = statistics[best]
    # A shuffle as extreme as the data counts against it (ties too: a flat series never splits).
    as_extreme = sum(
        split_statistics(rng.permutation(values), min_size).max()
        >= observed - 1e-12 * abs(observed)
        for _ in range(num_permutations)
    )
    p_value = (1 + as_extreme) / (1 + num_permutations)
    return Split(best + min_size, float(observed), p_value)


def change_points(
    series: Sequence[float],
    *,
    min_size: int = MIN_SIZE,
    num_permutations: int = NUM_PERMUTATIONS,
    alpha: float = ALPHA,
    seed: int = 0,
) -> list[Split]:
    """The significant splits of a series, in index order: each the index of the first value of
    a new segment. Each segment [start, end) draws its shuffles from its own stream
    (seed, start, end), so the answer does not depend on the order segments are searched in."""
    values = np.asarray(series, dtype=float)
    found: list[Split] = []
    pending = [(0, values.size)]
    while pending:
        start, end = pending.pop()
        rng = np.random.default_rng([seed, start, end])
        split = best_split(
            values[start:end], min_size=min_size, num_permutations=num_permutations, rng=rng
        )
        if split is None or split.p_value > alpha:
            continue
        at = start + split.index
        found.append(Split(at, split.statistic, split.p_value))
        pending += [(start, at), (at, end)]
    return sorted(found, key=lambda s: s.index)


# -- a history of runs ---------------------------------------------------------------------------


@dataclass(frozen=True)
class HistoryRun:
    name: str  # its folder's name in the history
    run: LoadedRun


@dataclass(frozen=True)
class History:
    folder: Path
    runs: tuple[HistoryRun, ...]  # oldest first
    is_by_start_time: bool  # False: ordered by name (a run without a start time)


def load_history(folder: Path, *, force: bool = False) -> History:
    """The run folders directly under `folder`, oldest first by `provenance.created_unix_s`
    (by name when a run has none), checked to be one benchmark (`runs.differences` between
    neighbours) unless `force`. A `UserError` of one line for anything unusable."""
    if not folder.is_dir():
        raise UserError(f"--history {folder}: no such folder; pass a folder of run folders")
    runs = []
    for sub in sorted(p for p in folder.iterdir() if p.is_dir()):
        side = load_side(sub)
        if None not in side:
            raise UserError(f"{sub}: a sweep folder; a history holds one run folder per run")
        runs.append(HistoryRun(sub.name, side[None]))
    if len(runs) < 2:
        raise UserError(
            f"--history {folder}: {len(runs)} run folder{'s' if len(runs) != 1 else ''}; "
            "a history needs at least 2 (one folder per run)"
        )
    is_by_start_time = all(r.run.result.provenance.created_unix_s > 0 for r in runs)
    if is_by_start_time:
        runs.sort(key=lambda r: (r.run.result.provenance.created_unix_s, r.name))
    if not force:
        for a, b in zip(runs, runs[1:], strict=False):
            found = differences(a.run.result, b.run.result)
            if found:
                raise UserError(
                    f"runs {a.name} and {b.name} are not the same benchmark: "
                    f"{'; '.join(found)}; pass --force to read the history anyway"
                )
    return History(folder, tuple(runs), is_by_start_time)


def history_gates(history: History) -> tuple[tuple[Gate, ...], list[str]]:
    """The shipped gates for the history's runs (`runs.default_gates_of`). Returns (gates,
    notes)."""
    runs = [r.run for r in history.runs]
    gates, left_out = default_gates_of(runs)
    if not left_out:
        return gates, []
    without = [r.path.parent.name for r in runs if not r.has_records]
    note = f"default latency gates left out ({', '.join(left_out)}): {without[0]} has no "
    note += "requests.jsonl"
    return gates, [note]


def run_value(run: LoadedRun, info: MetricInfo) -> float | None:
    """A run's one value of a metric: the mean over its repetitions (rates, MBU, MFU), or the
    statistic over all its measured requests (latencies), as `verdict.measure` takes it."""
    if info.is_per_request:
        groups = [np.asarray(g, dtype=float) for g in run.samples.per_request.get(info.family, ())]
        pooled = np.concatenate(groups) if groups else np.array([])
    else:
        pooled = np.array(run.samples.per_repetition.get(info.name, ()), dtype=float)
    pooled = pooled[np.isfinite(pooled)]
    if not pooled.size:
        return None
    if info.statistic == "mean":
        return float(pooled.mean())
    return float(np.percentile(pooled, float(info.statistic[1:]), method="linear"))


@dataclass(frozen=True)
class ChangePoint:
    """Where a metric's level moved: `run` is the first run of the new level."""

    run: str
    index: int  # in the metric's series
    before: float  # the mean of the segment before
    after: float  # the mean of the segment from `run` on
    p_value: float
    is_regression: bool  # the bad way for this metric
    failed_gates: tuple[str, ...]  # the gates this change alone breaks (past their threshold)

    @property
    def change(self) -> float | None:
        """(after − before) / before; None for a zero before."""
        return (self.after - self.before) / self.before if self.before else None


@dataclass(frozen=True)
class MetricHistory:
    info: MetricInfo
    gates: tuple[Gate, ...]
    runs: tuple[str, ...]  # the runs that measured it, oldest first
    values: tuple[float, ...]
    change_points: tuple[ChangePoint, ...]

    @property
    def is_failing(self) -> bool:
        """The last shift is past a gate, the bad way: a regression that is still there."""
        return bool(self.change_points and self.change_points[-1].failed_gates)


def _failed(gates: Sequence[Gate], before: float, after: float) -> tuple[str, ...]:
    """The gates a move from `before` to `after` breaks."""
    out = []
    for gate in gates:
        change = (after - before) / before if before else math.copysign(math.inf, after - before)
        broken = {
            "max_increase": change > gate.threshold,
            "max_decrease": change < -gate.threshold,
            "min": after < gate.threshold <= before,
            "max": after > gate.threshold >= before,
        }[gate.rule]
        if broken:
            out.append(gate.name)
    return tuple(out)


def analyse(
    history: History,
    gates: Sequence[Gate],
    *,
    seed: int = 0,
    num_permutations: int = NUM_PERMUTATIONS,
    alpha: float = ALPHA,
    min_size: int = MIN_SIZE,
) -> list[MetricHistory]:
    """Each gated metric's series and change points, in the gates' order (one entry per
    metric, with all its gates). A run without the metric is left out of its series."""
    metrics: dict[str, list[Gate]] = {}
    for gate in gates:
        metrics.setdefault(gate.metric, []).append(gate)
    out = []
    for own in metrics.values():
        info = own[0].info
        measured = [(r.name, run_value(r.run, info)) for r in history.runs]
        names = tuple(name for name, v in measured if v is not None)
        values = tuple(v for _, v in measured if v is not None)
        splits = change_points(
            values, min_size=min_size, num_permutations=num_permutations, alpha=alpha, seed=seed
        )
        bounds = [0, *(s.index for s in splits), len(values)]
        found = []
        for k, split in enumerate(splits):
            before = float(np.mean(values[bounds[k] : bounds[k + 1]]))
            after = float(np.mean(values[bounds[k + 1] : bounds[k + 2]]))
            is_worse = after < before if not info.is_lower_better else after > before
            found.append(
                ChangePoint(
                    run=names[split.index],
                    index=split.index,
                    before=before,
                    after=after,
                    p_value=split.p_value,
                    is_regression=is_worse,
                    failed_gates=_failed(own, before, after) if is_worse else (),
                )
            )
        out.append(MetricHistory(info, tuple(own), names, values, tuple(found)))
    return out


# -- outputs -------------------------------------------------------------------------------------


def value_text(x: float, info: MetricInfo) -> str:
    """A value in its unit: "26.2 ms", "0.5981" (a fraction has none)."""
    return f"{x:.4g}" if info.unit == "fraction" else f"{x:.4g} {info.unit}"


def change_text(point: ChangePoint, info: MetricInfo) -> str:
    """`run-06: 20.1 ms → 26.2 ms (+30.1%)`."""
    change = "" if point.change is None else f" ({point.change * 100:+.1f}%)"
    before, after = value_text(point.before, info), value_text(point.after, info)
    return f"{point.run}: {before} → {after}{change}"


def failing_line(metric: MetricHistory) -> str:
    """Why a metric fails: its last shift, the bad way, past which gates."""
    last, info = metric.change_points[-1], metric.info
    shift = change_text(last, info)
    return f"{', '.join(last.failed_gates)}: {info.name} shifted at {shift} and is still there"


def title(history: History, metrics: Sequence[MetricHistory]) -> str:
    failing = [m.info.name for m in metrics if m.is_failing]
    verdict = f"REGRESSION ({', '.join(failing)})" if failing else "no regression still there"
    return f"llmbench compare --history {history.folder}: {verdict}"


def method_text(seed: int) -> str:
    return (
        f"E-Divisive means: {NUM_PERMUTATIONS} permutations a split, significant at p ≤ {ALPHA:g}, "
        f"at least {MIN_SIZE} runs a segment, seed {seed}"
    )


def order_text(history: History) -> str:
    names = [r.name for r in history.runs]
    shown = ", ".join(names) if len(names) <= 6 else f"{names[0]} … {names[-1]}"
    order = "start time" if history.is_by_start_time else "name (a run has no start time)"
    return f"{len(names)} runs, oldest first by {order}: {shown}"


def render_table(history: History, metrics: Sequence[MetricHistory], seed: int) -> str:
    """For a terminal: the title, the runs, the method, then each metric's change points."""
    lines = [title(history, metrics), order_text(history), method_text(seed), ""]
    for m in metrics:
        gates = ", ".join(g.name.removeprefix(f"{m.info.name} ") for g in m.gates)
        found = len(m.change_points)
        count = f"{found} change point{'s' if found != 1 else ''}" if found else "no change point"
        if len(m.values) < 2 * MIN_SIZE:
            count = f"too few runs to split (fewer than {2 * MIN_SIZE})"
        status = "; last: REGRESSION, still there" if m.is_failing else ""
        lines.append(f"{m.info.name} ({gates}): {len(m.values)} runs, {count}{status}")
        for point in m.change_points:
            kind = "regression" if point.is_regression else "improvement"
            rules = [g.removeprefix(f"{m.info.name} ") for g in point.failed_gates]
            past = f", past {', '.join(rules)}" if rules else ""
            lines.append(f"  {change_text(point, m.info)} {kind}{past} (p {point.p_value:.3f})")
    failing = [failing_line(m) for m in metrics if m.is_failing]
    if failing:
        lines += ["", *failing]
    return "\n".join(lines) + "\n"


def to_dict(history: History, metrics: Sequence[MetricHistory], seed: int) -> dict[str, Any]:
    """The history as plain JSON-ready data (changes as fractions, values in the metric's unit)."""
    return {
        "history": str(history.folder),
        "has_regression": any(m.is_failing for m in metrics),
        "order": "start time" if history.is_by_start_time else "name",
        "runs": [r.name for r in history.runs],
        "method": {
            "name": "e-divisive means",
            "num_permutations": NUM_PERMUTATIONS,
            "alpha": ALPHA,
            "min_size": MIN_SIZE,
            "seed": seed,
        },
        "metrics": [
            {
                "metric": m.info.name,
                "unit": m.info.unit,
                "is_lower_better": m.info.is_lower_better,
                "gates": [g.name for g in m.gates],
                "is_failing": m.is_failing,
                "runs": list(m.runs),
                "values": list(m.values),
                "change_points": [
                    {
                        "run": p.run,
                        "index": p.index,
                        "before": p.before,
                        "after": p.after,
                        "change": p.change,
                        "p_value": p.p_value,
                        "is_regression": p.is_regression,
                        "failed_gates": list(p.failed_gates),
                    }
                    for p in m.change_points
                ],
            }
            for m in metrics
        ],
    }


def render(history: History, metrics: Sequence[MetricHistory], fmt: str, *, seed: int) -> str:
    """stdout of `compare --history`: "table" or "json"."""
    if fmt == "json":
        return json.dumps(to_dict(history, metrics, seed), indent=2) + "\n"
    return render_table(history, metrics, seed)
