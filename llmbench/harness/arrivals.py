"""Arrival schedules: when each request should be sent, as seconds from the start of the run.

Load is a seeded schedule: every function here is a pure function of its arguments, with its own
`random.Random(seed)`, so the same spec and seed give the same offsets on any machine. The driver
turns offsets into absolute send times and measures how late it was; it never sleeps "one gap" at
a time, which drifts (a requested 200 QPS becomes 183).

The first request of every generated schedule is at offset 0.0; n requests span n − 1 gaps.
"""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

from llmbench.errors import UserError

MAX_SWEEP_POINTS = 100  # a sweep's points: each one is a whole run
MAX_TRACE_REQUESTS = 1_000_000  # the lines of a trace read (a run uses its first `sessions`)


def _is_number(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _check_rate(rate_per_s: float) -> None:
    if not _is_number(rate_per_s) or not math.isfinite(rate_per_s) or rate_per_s <= 0:
        raise UserError(f"rate_per_s must be a finite number > 0 (requests/s), got {rate_per_s!r}")


def _check_num_requests(num_requests: int) -> None:
    if not isinstance(num_requests, int) or isinstance(num_requests, bool) or num_requests < 0:
        raise UserError(f"num_requests must be an integer >= 0, got {num_requests!r}")


def _cumulative(gaps_s: list[float]) -> list[float]:
    """[0, g0, g0 + g1, ...]: the offsets of requests separated by the given gaps."""
    offsets = [0.0]
    for gap in gaps_s:
        offsets.append(offsets[-1] + gap)
    return offsets


def constant_offsets(rate_per_s: float, num_requests: int) -> list[float]:
    """Evenly spaced sends.

    Formula: offset_i = i / rate_per_s, i = 0 … num_requests − 1.
    """
    _check_rate(rate_per_s)
    _check_num_requests(num_requests)
    return [i / rate_per_s for i in range(num_requests)]


def poisson_offsets(rate_per_s: float, num_requests: int, seed: int) -> list[float]:
    """A Poisson process: independent exponential gaps with mean 1 / rate_per_s.

    Formula: offset_0 = 0; offset_i = offset_{i−1} + Exp(rate_per_s), drawn from Random(seed).
    """
    _check_rate(rate_per_s)
    _check_num_requests(num_requests)
    if num_requests == 0:
        return []
    rng = random.Random(seed)
    return _cumulative([rng.expovariate(rate_per_s) for _ in range(num_requests - 1)])


def gamma_offsets(
    rate_per_s: float, burstiness: float, num_requests: int, seed: int
) -> list[float]:
    """Gamma-distributed gaps: the mean rate of a Poisson process, tunable burstiness.

    Formula: offset_0 = 0; offset_i = offset_{i−1} + Gamma(shape=burstiness,
    scale=1 / (rate_per_s · burstiness)), drawn from Random(seed). The mean gap is 1 / rate_per_s
    and its coefficient of variation 1 / √burstiness: 1.0 is Poisson, < 1 burstier, > 1 steadier.
    """
    _check_rate(rate_per_s)
    if not _is_number(burstiness) or not math.isfinite(burstiness) or burstiness <= 0:
        raise UserError(
            f"burstiness must be a finite number > 0 (1.0 = Poisson), got {burstiness!r}"
        )
    _check_num_requests(num_requests)
    if num_requests == 0:
        return []
    rng = random.Random(seed)
    scale_s = 1.0 / (rate_per_s * burstiness)
    return _cumulative([rng.gammavariate(burstiness, scale_s) for _ in range(num_requests - 1)])


def trace_offsets(path: str | Path, max_requests: int = MAX_TRACE_REQUESTS) -> list[float]:
    """Replay a recorded trace: one JSON object per line with a `timestamp` in seconds.

    Other fields are ignored; blank lines are skipped; timestamps must not decrease. Only the
    first `max_requests` requests are read (at most `MAX_TRACE_REQUESTS`): the file is read a
    line at a time, so a long trace costs the memory of those only.
    Formula: offset_i = timestamp_i − timestamp_0.
    """
    path = Path(path)
    max_requests = min(max_requests, MAX_TRACE_REQUESTS)
    timestamps: list[float] = []
    try:
        with path.open(encoding="utf-8") as lines:
            for line_no, line in enumerate(lines, start=1):
                if len(timestamps) >= max_requests:
                    break
                if line.strip():
                    timestamps.append(_timestamp(line, f"trace file {path}, line {line_no}"))
                    if len(timestamps) > 1 and timestamps[-1] < timestamps[-2]:
                        raise UserError(
                            f"trace file {path}, line {line_no}: timestamp {timestamps[-1]} is "
                            f"earlier than the line before ({timestamps[-2]}); sort the trace "
                            "by timestamp"
                        )
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"cannot read trace file {path}: {e}") from None
    if not timestamps:
        raise UserError(f"trace file {path} has no requests (expected JSON lines with 'timestamp')")
    return [ts - timestamps[0] for ts in timestamps]


def _timestamp(line: str, where: str) -> float:
    try:
        entry = json.loads(line)
    except json.JSONDecodeError as e:
        raise UserError(f"{where}: not valid JSON ({e.msg})") from None
    if not isinstance(entry, dict) or "timestamp" not in entry:
        raise UserError(f"{where}: expected an object with a 'timestamp' field (seconds)")
    ts = entry["timestamp"]
    if not _is_number(ts) or not math.isfinite(ts):
        raise UserError(f"{where}: 'timestamp' must be a number of seconds, got {ts!r}")
    return float(ts)


def sweep_points(values: list[float]) -> list[float]:
    """Check a sweep's values (rates or concurrencies): a non-empty list of numbers > 0, at
    most `MAX_SWEEP_POINTS` of them.

    Returns them as floats, sorted ascending.
    """
    if not isinstance(values, (list, tuple)) or not values:
        raise UserError(f"sweep values must be a non-empty list of numbers > 0, got {values!r}")
    if len(values) > MAX_SWEEP_POINTS:
        raise UserError(f"a sweep has at most {MAX_SWEEP_POINTS} points, got {len(values)}")
    for v in values:
        if not _is_number(v) or not math.isfinite(v) or v <= 0:
            raise UserError(f"sweep values must all be finite numbers > 0, got {v!r}")
    return sorted(float(v) for v in values)
