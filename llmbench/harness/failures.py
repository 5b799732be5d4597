"""Failed requests, judged: the share that failed against the spec's `max_failed_fraction`,
and the one line that says so (a run's warning, its exit reason, the report's banner).

A run where every measured request failed measured nothing: it exits 1 (`RunFailed`). Above
the fraction the run is flagged and exits 0 (its completed requests were measured, and an
overload test expects failures) unless the user asked for `--strict`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from llmbench.harness.spec import RunSpec

# What a result whose spec predates `max_failed_fraction` is judged by.
DEFAULT_MAX_FAILED_FRACTION = RunSpec.max_failed_fraction
MAX_ERROR_CHARS = 200  # of the most common error, as a line quotes it


class RunFailed(Exception):
    """The run measured nothing usable (every measured request failed), or failed more than
    its `max_failed_fraction` under `--strict`; its results and reports are written."""


def _one_line(text: str) -> str:
    words = " ".join(text.split())
    return words if len(words) <= MAX_ERROR_CHARS else words[: MAX_ERROR_CHARS - 1] + "…"


def _failed(summary: Mapping[str, Any]) -> tuple[int, int, str]:
    """(failed, measured, "most common error (k of n): <text>") of a summary."""
    num_failed = summary["num_failed"]
    measured = num_failed + summary["num_completed"]
    reasons = summary.get("failure_reasons") or {}
    if not reasons:
        return num_failed, measured, ""
    text, count = next(iter(reasons.items()))
    return num_failed, measured, f"most common error ({count} of {num_failed}): {_one_line(text)}"


def is_failed_fraction_high(summary: Mapping[str, Any], max_failed_fraction: float) -> bool:
    """Whether more measured requests failed than the spec allows (every one failing counts).

    Formula: failed_fraction > max_failed_fraction, or every measured request failed.
    """
    fraction = summary.get("failed_fraction")
    if fraction is None:
        return False
    return fraction > max_failed_fraction or fraction == 1.0


def failure_line(summary: Mapping[str, Any], max_failed_fraction: float) -> str | None:
    """The run's failures in one line (None when nothing failed): loud when every measured
    request failed or the failed fraction is above `max_failed_fraction`."""
    num_failed, measured, reason = _failed(summary)
    if not num_failed:
        return None
    if num_failed == measured:
        return f"all {measured} measured requests failed; {reason}"
    fraction = num_failed / measured
    limit = (
        f", above max_failed_fraction {max_failed_fraction:.1%}"
        if fraction > max_failed_fraction
        else ""
    )
    return (
        f"{num_failed} of {measured} measured requests failed ({fraction:.1%}{limit}); {reason}; "
        "latencies and rates are over the completed ones"
    )


def failure_verdict(
    summary: Mapping[str, Any], max_failed_fraction: float, is_strict: bool
) -> str | None:
    """Why the run exits 1, or None: every measured request failed (nothing was measured), or,
    with `is_strict`, more failed than `max_failed_fraction` allows."""
    num_failed, measured, _ = _failed(summary)
    if measured and num_failed == measured:
        return failure_line(summary, max_failed_fraction)
    if is_strict and is_failed_fraction_high(summary, max_failed_fraction):
        return failure_line(summary, max_failed_fraction)
    return None
