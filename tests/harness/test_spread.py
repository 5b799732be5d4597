"""The between-repetition spread: mean, stdev (n − 1) and cv of each metric, by hand."""

from __future__ import annotations

import pytest

from llmbench.harness.spread import SPREAD_METRICS, metric_value, spread, spread_of


def test_spread_of_by_hand():
    # 10, 12, 14: mean 12, stdev √((4 + 0 + 4) / 2) = 2, cv 2 / 12.
    assert spread_of([10.0, 12.0, 14.0]) == pytest.approx({"mean": 12.0, "stdev": 2.0, "cv": 1 / 6})
    # Two values: stdev √((0.5² + 0.5²) / 1).
    assert spread_of([1.0, 2.0]) == pytest.approx(
        {"mean": 1.5, "stdev": 0.5**0.5, "cv": 0.5**0.5 / 1.5}
    )
    assert spread_of([5.0]) == {"mean": 5.0, "stdev": None, "cv": None}  # one repetition
    assert spread_of([]) == {"mean": None, "stdev": None, "cv": None}
    assert spread_of([0.0, 0.0]) == {"mean": 0.0, "stdev": 0.0, "cv": None}  # no cv of a 0 mean


def test_metric_value_reads_a_statistic_or_a_number():
    summary = {"tpot_ms": {"p50": 3.5, "p99": None}, "decode_mbu": 0.4, "machine_busy": True}
    assert metric_value(summary, "tpot_ms.p50") == 3.5
    assert metric_value(summary, "tpot_ms.p99") is None
    assert metric_value(summary, "decode_mbu") == 0.4
    assert metric_value(summary, "prefill_mfu") is None  # absent: no roofline
    assert metric_value(summary, "decode_mbu.p50") is None
    assert metric_value(summary, "machine_busy") is None  # a flag, not a number


def test_spread_names_every_metric_and_skips_repetitions_without_a_value():
    summaries = [
        {"tpot_ms": {"p50": 2.0}, "decode_mbu": 0.5, "output_tok_per_s": 100.0},
        {"tpot_ms": {"p50": 4.0}, "decode_mbu": None, "output_tok_per_s": 110.0},
        {"tpot_ms": {"p50": 3.0}, "decode_mbu": 0.7, "output_tok_per_s": 90.0},
    ]
    out = spread(summaries)
    assert list(out) == list(SPREAD_METRICS)
    assert out["tpot_ms.p50"] == pytest.approx({"mean": 3.0, "stdev": 1.0, "cv": 1 / 3})
    # 0.5 and 0.7 (the second repetition has no decode step): stdev √(0.02).
    assert out["decode_mbu"] == pytest.approx(
        {"mean": 0.6, "stdev": 0.02**0.5, "cv": 0.02**0.5 / 0.6}
    )
    assert out["output_tok_per_s"] == pytest.approx({"mean": 100.0, "stdev": 10.0, "cv": 0.1})
    assert out["prefill_mfu"] == {"mean": None, "stdev": None, "cv": None}
    expected = {
        f"{m}.{s}"
        for m in (
            "ttft_ms",
            "ttft_from_send_ms",
            "tpot_ms",
            "itl_ms",
            "icl_ms",
            "e2e_ms",
            "queue_ms",
        )
        for s in ("mean", "p50", "p90", "p95", "p99")
    }
    assert set(SPREAD_METRICS) == expected | {
        "output_tok_per_s",
        "input_tok_per_s",
        "request_per_s",
        "goodput_request_per_s",
        "goodput_fraction",
        "decode_mbu",
        "prefill_mfu",
        "prefix_cache_hit_rate",
    }
