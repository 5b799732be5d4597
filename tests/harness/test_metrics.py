"""Metrics against hand-computed values on hand-built records (times in round milliseconds)."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from llmbench.errors import UserError
from llmbench.harness.metrics import (
    distribution,
    e2e_from_send_ms,
    e2e_ms,
    icl_samples_ms,
    is_slo_met,
    itl_samples_ms,
    percentile,
    queue_ms,
    server_decode_ms_per_token,
    server_prompt_ms,
    summarize,
    tpot_ms,
    tpot_overhead_ms,
    ttft_from_send_ms,
    ttft_ms,
    ttft_overhead_ms,
)
from llmbench.harness.records import RequestRecord, ServerTimings

MS = 1_000_000  # ns


def rec(
    scheduled: int,
    sent: int,
    chunks: list[tuple[int, int]],
    end: int,
    *,
    prompt: int = 0,
    server_prompt: int | None = None,
    cached: int | None = None,
    error: str | None = None,
    is_warmup: bool = False,
    server_timings: ServerTimings | None = None,
) -> RequestRecord:
    """A record whose times are given in ms; chunks are (t_ms, num_tokens)."""
    return RequestRecord(
        request_id="r",
        session_id="s",
        turn=0,
        scheduled_ns=scheduled * MS,
        sent_ns=sent * MS,
        end_ns=end * MS,
        chunk_ns=[t * MS for t, _ in chunks],
        chunk_tokens=[k for _, k in chunks],
        num_prompt_tokens=prompt,
        server_prompt_tokens=server_prompt,
        cached_tokens=cached,
        error=error,
        is_warmup=is_warmup,
        server_timings=server_timings,
    )


# One token per chunk; the driver sent it 2 ms late.
A = rec(
    10, 12, [(110, 1), (130, 1), (150, 1), (190, 1)], 200, prompt=100, server_prompt=100, cached=50
)
# Three tokens per chunk (speculative decoding / batched deltas); server counts 210 prompt tokens.
B = rec(20, 20, [(70, 3), (100, 3), (130, 3)], 140, prompt=200, server_prompt=210)
# A one-token reply.
C = rec(30, 35, [(75, 1)], 80, prompt=50, cached=0)
# Failed after 372 ms, no tokens; its end closes the measured window.
D = rec(40, 40, [], 412, prompt=70, error="HTTP 500")
# Warm-up: earlier and later than everything else, and must change nothing.
W = rec(0, 0, [(5, 1), (900, 1)], 1000, prompt=1000, cached=1000, is_warmup=True)


# --- per request ------------------------------------------------------------------------------


def test_ttft_from_scheduled_and_from_send():
    assert ttft_ms(A) == 100.0  # 110 − 10
    assert ttft_from_send_ms(A) == 98.0  # 110 − 12
    assert ttft_ms(B) == 50.0
    assert ttft_ms(C) == 45.0 and ttft_from_send_ms(C) == 40.0
    assert ttft_ms(D) is None and ttft_from_send_ms(D) is None


def test_ttft_skips_chunks_without_tokens():
    r = rec(0, 0, [(5, 0), (30, 2)], 40)
    assert ttft_ms(r) == 30.0
    assert icl_samples_ms(r) == []


def test_tpot_counts_every_token_of_a_chunk():
    assert tpot_ms(A) == pytest.approx(80 / 3)  # (190 − 110) / (4 − 1)
    assert tpot_ms(B) == 7.5  # (130 − 70) / (9 − 1)
    assert tpot_ms(C) is None  # one token: no TPOT
    assert tpot_ms(D) is None
    assert tpot_ms(rec(0, 0, [(50, 4)], 60)) == 0.0  # all tokens in one chunk


def test_itl_gives_k_samples_per_k_token_chunk():
    assert itl_samples_ms(A) == [20.0, 20.0, 40.0]
    # Gaps of 30 ms carrying 3 tokens: 3 samples of 10 ms each; the first chunk's 2 extra
    # tokens give none, so 9 − 3 = 6 samples summing to t_last − t_first = 60 ms.
    assert itl_samples_ms(B) == [10.0] * 6
    assert itl_samples_ms(C) == []
    assert itl_samples_ms(rec(0, 0, [(10, 1), (30, 4)], 40)) == [5.0] * 4


def test_icl_keeps_raw_chunk_gaps():
    assert icl_samples_ms(A) == [20.0, 20.0, 40.0]
    assert icl_samples_ms(B) == [30.0, 30.0]
    assert icl_samples_ms(C) == []


def test_e2e_and_queue():
    assert e2e_ms(A) == 190.0  # 200 − 10
    assert e2e_from_send_ms(A) == 188.0  # 200 − 12
    assert queue_ms(A) == 2.0
    assert queue_ms(B) == 0.0
    assert queue_ms(C) == 5.0
    unfinished = RequestRecord("r", "s", 0, scheduled_ns=5 * MS, sent_ns=6 * MS)
    assert e2e_ms(unfinished) is None and e2e_from_send_ms(unfinished) is None


def test_is_slo_met():
    assert is_slo_met(A, {})
    assert not is_slo_met(A, {"ttft_ms": 99.0})
    assert is_slo_met(A, {"ttft_ms": 100.0})  # the limit itself is met
    assert is_slo_met(A, {"ttft_from_send_ms": 99.0})  # 98 from the send
    assert is_slo_met(C, {"tpot_ms": 1.0})  # a 1-token reply has no TPOT to break
    assert not is_slo_met(D, {})  # a failed request never meets an SLO
    assert not is_slo_met(A, {"queue_ms": 1.0})
    assert is_slo_met(B, {"e2e_ms": 120.0, "tpot_ms": 7.5})
    # An ITL SLO limits every token gap of the request: A's worst is 40 ms, B's 10 ms.
    assert not is_slo_met(A, {"itl_ms": 39.0})
    assert is_slo_met(A, {"itl_ms": 40.0})
    assert is_slo_met(B, {"itl_ms": 10.0})


def test_unknown_slo_key_is_a_user_error_naming_it():
    with pytest.raises(UserError, match="'ttft_p99'"):
        is_slo_met(A, {"ttft_p99": 1.0})
    with pytest.raises(UserError, match="'itl'"):
        summarize([], {"itl": 1.0})


# --- aggregates -------------------------------------------------------------------------------


def test_percentile_by_hand():
    assert percentile([1, 2, 3, 4], 50) == 2.5  # h = 1.5: halfway between 2 and 3
    assert percentile([4, 3, 2, 1], 0) == 1.0  # sorted first
    assert percentile([1, 2, 3, 4], 100) == 4.0
    assert percentile([1, 2, 3, 4], 90) == pytest.approx(3.7)  # h = 2.7: 3 + 0.7 · (4 − 3)
    assert percentile([10, 20, 30, 40, 50], 25) == 20.0  # h = 1 exactly: no interpolation
    assert percentile([10, 20, 30, 40, 50], 30) == pytest.approx(22.0)  # h = 1.2: 20 + 0.2 · 10
    assert percentile([-5.0, 5.0], 75) == 2.5  # h = 0.75: −5 + 0.75 · 10
    assert percentile([10.0], 99) == 10.0
    assert percentile([], 50) is None
    assert percentile(iter([3, 1, 2]), 50) == 2.0  # any iterable
    with pytest.raises(ValueError):
        percentile([1.0], 101)
    with pytest.raises(ValueError):
        percentile([1.0], -1)


def test_p99_of_101_latencies_by_hand():
    # 0, 1, ..., 100 ms shuffled: h = 100 · 0.99 = 99, exactly the 100th value; p99.5 lies
    # halfway between 99 and 100.
    values = [float((7 * i) % 101) for i in range(101)]
    assert percentile(values, 99) == 99.0
    assert percentile(values, 99.5) == 99.5
    assert percentile(values, 50) == 50.0


@given(
    st.lists(st.floats(-1e9, 1e9, allow_nan=False), min_size=1, max_size=200),
    st.floats(0, 100),
    st.floats(0, 100),
)
def test_percentile_is_monotone_and_within_the_values(values, q1, q2):
    lo, hi = sorted((q1, q2))
    assert min(values) <= percentile(values, lo) <= percentile(values, hi) <= max(values)
    assert percentile(values, 0) == min(values) and percentile(values, 100) == max(values)


def test_distribution():
    d = distribution([4, 1, 3, 2])
    assert d == {
        "mean": 2.5,
        "p50": 2.5,
        "p90": pytest.approx(3.7),
        "p95": pytest.approx(3.85),
        "p99": pytest.approx(3.97),
        "max": 4.0,
        "count": 4,
    }
    empty = distribution([])
    assert empty["count"] == 0
    assert all(v is None for k, v in empty.items() if k != "count")


def test_summarize_by_hand():
    s = summarize([A, B, C, D, W])
    # Window: first send of a measured request (A, 12 ms) to the last end (D, 412 ms).
    assert s["duration_s"] == pytest.approx(0.4)
    assert s["num_completed"] == 3 and s["num_failed"] == 1
    assert s["output_tok_per_s"] == pytest.approx(35.0)  # (4 + 9 + 1) / 0.4
    assert s["input_tok_per_s"] == pytest.approx(875.0)  # (100 + 200 + 50) / 0.4
    assert s["request_per_s"] == pytest.approx(7.5)  # 3 / 0.4

    assert s["ttft_ms"]["count"] == 3
    assert s["ttft_ms"]["mean"] == pytest.approx(65.0)  # (100 + 50 + 45) / 3
    assert s["ttft_ms"]["p50"] == 50.0 and s["ttft_ms"]["max"] == 100.0
    assert s["ttft_from_send_ms"]["mean"] == pytest.approx(188 / 3)  # (98 + 50 + 40) / 3
    assert s["tpot_ms"]["count"] == 2  # C has one token
    assert s["tpot_ms"]["mean"] == pytest.approx((80 / 3 + 7.5) / 2)
    assert s["itl_ms"]["count"] == 9  # 3 from A + 6 from B
    assert s["itl_ms"]["mean"] == pytest.approx(140 / 9)  # (80 + 60) / 9
    assert s["icl_ms"]["count"] == 5
    assert s["icl_ms"]["mean"] == pytest.approx(28.0)  # (20 + 20 + 40 + 30 + 30) / 5
    assert s["e2e_ms"]["mean"] == pytest.approx(120.0)  # (190 + 120 + 50) / 3
    assert s["queue_ms"]["count"] == 4  # the failed request was sent too
    assert s["queue_ms"]["mean"] == pytest.approx(1.75)  # (2 + 0 + 5 + 0) / 4

    assert s["goodput_request_per_s"] == pytest.approx(7.5)  # no SLO: every completed request
    assert s["goodput_fraction"] == pytest.approx(0.75)  # 3 of 4
    # A: 50 cached of 100; C: 0 cached of 50 (no server count: the client's); B reports none.
    assert s["prefix_cache_hit_rate"] == pytest.approx(1 / 3)
    assert s["token_count_mismatches"] == 1  # B: server 210 vs client 200


def test_warmup_records_change_nothing():
    assert summarize([A, B, C, D, W]) == summarize([A, B, C, D])


def test_goodput_with_slos():
    s = summarize([A, B, C, D], {"ttft_ms": 60.0})  # A (100 ms) misses
    assert s["goodput_request_per_s"] == pytest.approx(5.0)  # 2 / 0.4
    assert s["goodput_fraction"] == pytest.approx(0.5)
    s = summarize([A, B, C, D], {"ttft_ms": 60.0, "tpot_ms": 5.0})  # B misses TPOT; C has none
    assert s["goodput_request_per_s"] == pytest.approx(2.5)
    assert s["goodput_fraction"] == pytest.approx(0.25)
    s = summarize([A, B, C, D], {"e2e_ms": 150.0})  # A (190 ms) misses
    assert s["goodput_fraction"] == pytest.approx(0.5)
    assert s["request_per_s"] == pytest.approx(7.5)  # SLOs do not change throughput


def test_compat_names():
    c = summarize([A, B, C, D, W])["compat"]
    vllm = c["vllm"]
    assert vllm["mean_ttft_ms"] == pytest.approx(188 / 3)  # from the send: 98, 50, 40
    assert vllm["median_ttft_ms"] == 50.0
    assert vllm["p99_ttft_ms"] == pytest.approx(97.04)  # 50 + 0.98 · (98 − 50)
    assert vllm["mean_tpot_ms"] == pytest.approx((80 / 3 + 7.5) / 2)
    assert vllm["median_tpot_ms"] == pytest.approx((80 / 3 + 7.5) / 2)
    assert vllm["p99_tpot_ms"] == pytest.approx(7.5 + 0.99 * (80 / 3 - 7.5))
    # vLLM's ITL is one sample per chunk: our ICL [20, 20, 30, 30, 40].
    assert vllm["mean_itl_ms"] == pytest.approx(28.0)
    assert vllm["median_itl_ms"] == 30.0
    assert vllm["p99_itl_ms"] == pytest.approx(39.6)
    assert vllm["output_throughput"] == pytest.approx(35.0)
    assert vllm["request_throughput"] == pytest.approx(7.5)

    guidellm = c["guidellm"]
    assert guidellm["time_to_first_token_ms"] == pytest.approx(188 / 3)
    assert guidellm["inter_token_latency_ms"] == pytest.approx((80 / 3 + 7.5) / 2)  # our TPOT
    # (t_last − sent) / n_out: A (190 − 12) / 4, B (130 − 20) / 9, C (75 − 35) / 1.
    assert guidellm["time_per_output_token_ms"] == pytest.approx((44.5 + 110 / 9 + 40) / 3)
    assert guidellm["request_latency_s"] == pytest.approx(353 / 3 / 1000)  # 188, 120, 45 ms

    aiperf = c["aiperf"]
    assert aiperf["time_to_first_token"] == pytest.approx(188 / 3)
    assert aiperf["inter_token_latency"] == pytest.approx((80 / 3 + 7.5) / 2)
    assert aiperf["inter_chunk_latency"] == pytest.approx(28.0)
    assert aiperf["request_latency"] == pytest.approx(353 / 3)
    assert aiperf["output_token_throughput"] == pytest.approx(35.0)


def test_summarize_nothing_measured():
    s = summarize([W])
    assert s["num_completed"] == 0 and s["num_failed"] == 0
    assert s["duration_s"] == 0.0
    assert s["output_tok_per_s"] is None and s["request_per_s"] is None
    assert s["goodput_fraction"] is None and s["prefix_cache_hit_rate"] is None
    assert s["ttft_ms"]["count"] == 0 and s["ttft_ms"]["mean"] is None
    assert s["compat"]["vllm"]["mean_ttft_ms"] is None
    assert s["compat"]["guidellm"]["request_latency_s"] is None


def test_hit_rate_is_none_when_no_request_reports_cached_tokens():
    assert summarize([B])["prefix_cache_hit_rate"] is None


def test_token_counts_are_not_checked_without_a_server_count():
    """No completed request came with the server's prompt count: the mismatches are "not
    checked" (None), not 0 (which would say the counts were checked and agreed)."""
    assert summarize([C, D])["token_count_mismatches"] is None
    assert summarize([A, C])["token_count_mismatches"] == 0  # A: checked, and equal


def test_failed_fraction_and_the_most_common_errors():
    timeout = rec(50, 50, [], 60, error="TimeoutError: read timed out")
    again = rec(60, 60, [], 70, error="HTTP 500")
    warm = rec(0, 0, [], 5, error="TimeoutError: read timed out", is_warmup=True)
    s = summarize([A, timeout, D, again, warm])
    assert s["failed_fraction"] == pytest.approx(0.75)  # 3 of 4 measured
    assert s["failure_reasons"] == {"HTTP 500": 2, "TimeoutError: read timed out": 1}
    assert list(s["failure_reasons"]) == ["HTTP 500", "TimeoutError: read timed out"]
    assert summarize([A])["failure_reasons"] == {} and summarize([A])["failed_fraction"] == 0
    assert summarize([W])["failed_fraction"] is None  # nothing measured


# The same requests, with the timings their server reported (llama.cpp reports
# prompt_ms and predicted_per_token_ms; another server may give only decode_ms and its tokens).
TIMED_A = rec(
    10, 12, [(110, 1), (130, 1), (150, 1), (190, 1)], 200,
    server_timings=ServerTimings(prompt_ms=90.0, decode_ms_per_token=25.0, source="llama.cpp"),
)  # fmt: skip
TIMED_B = rec(
    20, 20, [(70, 3), (100, 3), (130, 3)], 140,
    server_timings=ServerTimings(prompt_ms=44.0, decode_ms=56.0, decode_tokens=8, source="x"),
)  # fmt: skip
TIMED_C = rec(30, 35, [(75, 1)], 80, server_timings=ServerTimings(prompt_ms=30.0, source="x"))
TIMED_D = rec(
    40, 40, [], 412, error="HTTP 500", server_timings=ServerTimings(prompt_ms=1.0, source="x")
)


def test_server_timings_and_the_overheads_per_request():
    # A: TTFT from send 110 − 12 = 98 ms, TPOT (190 − 110) / 3 ms.
    assert server_prompt_ms(TIMED_A) == 90.0 and ttft_overhead_ms(TIMED_A) == pytest.approx(8.0)
    assert server_decode_ms_per_token(TIMED_A) == 25.0
    assert tpot_overhead_ms(TIMED_A) == pytest.approx(80 / 3 - 25)
    # B: 50 ms TTFT, TPOT 60 / 8 = 7.5 ms; per token from decode_ms / decode_tokens = 7 ms.
    assert ttft_overhead_ms(TIMED_B) == pytest.approx(6.0)
    assert server_decode_ms_per_token(TIMED_B) == pytest.approx(7.0)
    assert tpot_overhead_ms(TIMED_B) == pytest.approx(0.5)
    # C: one token (no TPOT) and no decode timing; A without timings has none of it.
    assert ttft_overhead_ms(TIMED_C) == pytest.approx(10.0)  # 40 − 30
    assert server_decode_ms_per_token(TIMED_C) is None and tpot_overhead_ms(TIMED_C) is None
    assert server_prompt_ms(A) is None and ttft_overhead_ms(A) is None


def test_summarize_splits_server_and_client_time():
    s = summarize([TIMED_A, TIMED_B, TIMED_C, TIMED_D])
    # Over completed requests only: D's timing is left out.
    assert s["server_prompt_ms"]["count"] == 3
    assert s["server_prompt_ms"]["mean"] == pytest.approx(164 / 3)  # (90 + 44 + 30) / 3
    assert s["server_prompt_ms"]["p50"] == 44.0 and s["server_prompt_ms"]["max"] == 90.0
    assert s["ttft_overhead_ms"]["mean"] == pytest.approx(8.0)  # (8 + 6 + 10) / 3
    assert s["ttft_overhead_ms"]["p50"] == pytest.approx(8.0)
    assert s["server_decode_ms_per_token"]["count"] == 2
    assert s["server_decode_ms_per_token"]["mean"] == pytest.approx(16.0)  # (25 + 7) / 2
    assert s["tpot_overhead_ms"]["mean"] == pytest.approx((80 / 3 - 25 + 0.5) / 2)
    # p99 of two values, linear: 0.5 + 0.99 · (1.667 − 0.5).
    assert s["tpot_overhead_ms"]["p99"] == pytest.approx(0.5 + 0.99 * (80 / 3 - 25 - 0.5))


def test_server_timings_are_null_when_the_server_reported_none():
    s = summarize([A, B, C, D])
    for key in ("server_prompt_ms", "server_decode_ms_per_token"):
        assert s[key] is None
    assert s["ttft_overhead_ms"] is None and s["tpot_overhead_ms"] is None
    # Only prompt timings: the decode side stays null.
    s = summarize([TIMED_C])
    assert s["server_prompt_ms"]["count"] == 1 and s["server_decode_ms_per_token"] is None


def test_a_routed_run_is_summarised_per_endpoint():
    """Three requests over two endpoints in a window of 0..200 ms (by hand):
    endpoint 0: A (sent 12, end 200: 188 ms in flight; TTFT 100, TPOT (190−110)/3 = 26.67 ms,
    50 of 100 prompt tokens cached) and a failure (sent 10, end 50: 40 ms);
    endpoint 1: B (sent 20, end 140: 120 ms; TTFT 50, TPOT (130−70)/8 = 7.5 ms, no cached count).
    Window: 200 − 10 = 190 ms. Mean in flight: 0: 228 / 190 = 1.2; 1: 120 / 190 = 0.6316;
    imbalance: 1.2 / mean(1.2, 0.6316) = 1.2 / 0.9158 = 1.3103."""
    a = dataclasses.replace(A, endpoint=0)
    failed = dataclasses.replace(rec(10, 10, [], 50, prompt=5, error="HTTP 500"), endpoint=0)
    b = dataclasses.replace(B, endpoint=1)
    summary = summarize([a, failed, b])
    first, second = summary["endpoints"]
    assert first == {
        "endpoint": 0,
        "requests": 2,
        "failed": 1,
        "prefix_cache_hit_rate": 0.5,
        "ttft_ms_p50": 100.0,
        "tpot_ms_p50": pytest.approx(80 / 3),
        "mean_in_flight": pytest.approx(228 / 190),
    }
    assert second["requests"] == 1 and second["prefix_cache_hit_rate"] is None
    assert second["ttft_ms_p50"] == 50.0 and second["tpot_ms_p50"] == 7.5
    assert second["mean_in_flight"] == pytest.approx(120 / 190)
    assert summary["endpoint_imbalance"] == pytest.approx(1.2 / ((228 + 120) / 190 / 2))
    assert "endpoints" not in summarize([A, B])  # one endpoint: nothing routed
    # Three endpoints, the third sent nothing: it is listed, and its idle load counts.
    idle = summarize([a, failed, b], num_endpoints=3)["endpoints"]
    assert idle[2] == {
        "endpoint": 2,
        "requests": 0,
        "failed": 0,
        "prefix_cache_hit_rate": None,
        "ttft_ms_p50": None,
        "tpot_ms_p50": None,
        "mean_in_flight": 0.0,
    }
    three = summarize([a, failed, b], num_endpoints=3)["endpoint_imbalance"]
    assert three == pytest.approx(1.2 / ((228 + 120) / 190 / 3))
