"""Failed requests judged against max_failed_fraction, and the line that says so."""

from __future__ import annotations

from llmbench.harness.failures import failure_line, failure_verdict, is_failed_fraction_high
from llmbench.harness.metrics import summarize
from tests.harness.test_run_warnings import req


def test_failures_are_said_with_the_most_common_error():
    ok, e500, slow = req(), req(error="HTTP 500: (empty body)"), req(error="TimeoutError")
    summary = summarize([ok] * 17 + [e500, e500, slow])
    line = failure_line(summary, 0.05)
    assert line == (
        "3 of 20 measured requests failed (15.0%, above max_failed_fraction 5.0%); most common "
        "error (2 of 3): HTTP 500: (empty body); latencies and rates are over the completed ones"
    )
    assert is_failed_fraction_high(summary, 0.05) and not is_failed_fraction_high(summary, 0.2)
    within = failure_line(summary, 0.2)
    assert within.startswith("3 of 20 measured requests failed (15.0%); most common")
    assert failure_line(summarize([ok]), 0.05) is None


def test_a_run_whose_requests_all_failed_fails_and_strict_fails_above_the_fraction():
    everything = summarize([req(error="HTTP 400: (empty body)")] * 6)
    assert failure_verdict(everything, 0.05, is_strict=False) == (
        "all 6 measured requests failed; most common error (6 of 6): HTTP 400: (empty body)"
    )
    assert is_failed_fraction_high(everything, 1.0)  # every one failing is always too many
    some = summarize([req()] * 9 + [req(error="HTTP 500")])  # 10% failed
    assert failure_verdict(some, 0.05, is_strict=False) is None
    assert failure_verdict(some, 0.05, is_strict=True).startswith("1 of 10 measured requests")
    assert failure_verdict(some, 0.1, is_strict=True) is None  # at the limit is within it
    assert failure_verdict(summarize([]), 0.05, is_strict=True) is None  # nothing measured


def test_an_error_text_is_one_short_line():
    long = "HTTP 500: " + "x\n" * 400
    line = failure_line(summarize([req(error=long)]), 0.05)
    assert "\n" not in line and len(line) < 300 and line.endswith("…")
