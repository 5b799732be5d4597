"""Tests for llmbench.harness.speculative_stats: a run's speculation numbers, by hand."""

from __future__ import annotations

import pytest

from llmbench.harness.speculative_stats import format_speculative, speculative_summary


def point(duration_ns, proposed=0, accepted=0, verifies=0, draft_ns=0, **extra):
    return {
        "t_start_ns": 1_000,
        "t_end_ns": 1_000 + duration_ns,
        "num_proposed_tokens": proposed,
        "num_accepted_tokens": accepted,
        "num_verify_seqs": verifies,
        "draft_ns": draft_ns,
        **extra,
    }


def test_speculative_summary_by_hand():
    points = [
        point(50_000_000),  # a prefill: no drafts
        point(40_000_000, proposed=8, accepted=6, verifies=2, draft_ns=10_000_000),
        point(30_000_000, proposed=4, accepted=1, verifies=1, draft_ns=5_000_000),
        # drafted, but the budget left no room to verify: its time is drafting only
        point(20_000_000, draft_ns=2_000_000, draft_flops=7.0, draft_bytes=9.0),
    ]
    s = speculative_summary(points)
    assert s["num_proposed_tokens"] == 12 and s["num_accepted_tokens"] == 7
    assert s["acceptance_rate"] == pytest.approx(7 / 12)
    assert s["num_verifies"] == 3
    assert s["mean_accepted_per_verify"] == pytest.approx(7 / 3)
    assert s["mean_tokens_per_verify"] == pytest.approx((7 + 3) / 3)
    assert s["draft_s"] == pytest.approx(0.017)
    assert s["verify_s"] == pytest.approx(0.030 + 0.025)  # step time - draft time
    assert s["draft_fraction"] == pytest.approx(0.017 / 0.140)
    assert (s["draft_flops"], s["draft_bytes"]) == (7.0, 9.0)
    assert format_speculative(s) == (
        "speculative: 7 of 12 draft tokens accepted (58%), 3.33 tokens per verify; "
        "drafting 0.02 s, verifying 0.06 s"
    )
    assert s["num_withheld_tokens"] == 0


def test_the_drafts_an_adaptive_budget_withheld_are_counted_and_said():
    points = [
        point(40_000_000, proposed=2, accepted=2, verifies=1, draft_ns=1, num_withheld_tokens=6),
        point(30_000_000, draft_ns=1, num_withheld_tokens=8),  # every draft withheld
        point(50_000_000, num_withheld_tokens=0),
    ]
    s = speculative_summary(points)
    assert (s["num_proposed_tokens"], s["num_withheld_tokens"]) == (2, 14)
    assert format_speculative(s).startswith(
        "speculative: 2 of 2 draft tokens accepted (100%) (14 more withheld as not worth their "
        "cost), 3.00 tokens per verify;"
    )


def test_no_drafting_means_no_speculative_block():
    assert speculative_summary([point(1_000), {"t_start_ns": 0, "t_end_ns": 5}]) is None
    assert speculative_summary([]) is None


def test_drafting_that_never_proposed_has_no_rates():
    s = speculative_summary([point(1_000, draft_ns=100)])
    assert s["num_proposed_tokens"] == 0
    assert s["acceptance_rate"] is None and s["mean_tokens_per_verify"] is None
    assert "- tokens per verify" in format_speculative(s)


def test_a_verify_step_against_a_decode_step_of_as_many_sequences_by_hand():
    ms = 1_000_000
    points = [
        point(200 * ms, phase="prefill", num_seqs=1),  # not decode-shaped: left out
        # 1 sequence: decode 10, 14 (median 12); verify 18 (+ 2 drafting) → 18 / 12 = 1.5
        point(10 * ms, phase="decode", num_seqs=1),
        point(14 * ms, phase="decode", num_seqs=1),
        point(20 * ms, 4, 3, 1, 2 * ms, phase="decode", num_seqs=1),
        # 4 sequences: decode 20; verify 40, 40, 60 (median 40) → 2.0, three verifies
        point(20 * ms, phase="decode", num_seqs=4),
        *[point(t * ms, 16, 12, 4, 0, phase="decode", num_seqs=4) for t in (40, 40, 60)],
        # 3 sequences verified only: no decode step to compare with, left out
        point(30 * ms, 12, 9, 3, 0, phase="decode", num_seqs=3),
    ]
    s = speculative_summary(points)
    assert s["verify_over_decode"] == pytest.approx((1 * 1.5 + 3 * 2.0) / 4)
    assert s["verify_step_ms"] == pytest.approx(40.0)  # median of 18, 40, 40, 60
    assert s["decode_step_ms"] == pytest.approx(14.0)  # median of 10, 14, 20
    assert format_speculative(s).endswith("; a verify step costs 1.88x a decode step")
    only_verifies = [p for p in points if p.get("num_verify_seqs")]
    assert speculative_summary(only_verifies)["verify_over_decode"] is None
