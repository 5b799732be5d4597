"""Latency and throughput metrics: small pure functions over `RequestRecord`s.

Every clock is an integer `time.perf_counter_ns()`; every result carries its unit in its name.
One name means one number, whatever other tools call it:

- `ttft_ms`  first output token − *scheduled* send (coordinated-omission safe);
- `tpot_ms`  per request, (t_last − t_first) / (n_out − 1);
- `itl_ms`   every gap between consecutive *tokens*: a chunk of k tokens after a gap g gives
             k samples of g / k, so multi-token chunks neither inflate ITL nor hide tokens;
- `icl_ms`   every raw gap between consecutive chunks.

When a server reports its own timings (`RequestRecord.server_timings`), `server_prompt_ms` and
`server_decode_ms_per_token` are its numbers, and `ttft_overhead_ms` / `tpot_overhead_ms` what
the client saw beyond them: the server's HTTP, templating, tokenization and per-token sending,
the network and the client's parsing.

The `compat` block of `summarize` repeats the numbers under vLLM / GuideLLM / AIPerf names.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from itertools import pairwise

import numpy as np

from llmbench.errors import UserError
from llmbench.harness.records import RequestRecord

# Per-request latency distributions (one sample per request, or per token gap for itl/icl);
# a gate names one statistic of them: `tpot_ms.p50`.
LATENCY_FAMILIES = (
    "ttft_ms",
    "ttft_from_send_ms",
    "tpot_ms",
    "itl_ms",
    "icl_ms",
    "e2e_ms",
    "queue_ms",
)
# No `max`: a bootstrap cannot bound a sample maximum (a resample never exceeds the original).
STATISTICS = ("mean", "p50", "p90", "p95", "p99")

NS_PER_MS = 1_000_000
NS_PER_S = 1_000_000_000

PERCENTILES = (50, 90, 95, 99)


# --- per request ------------------------------------------------------------------------------


def _token_chunks(r: RequestRecord) -> list[tuple[int, int]]:
    """(t_ns, num_tokens) of the chunks that carry at least one output token, in order."""
    return [(t, k) for t, k in zip(r.chunk_ns, r.chunk_tokens, strict=True) if k > 0]


def ttft_ms(r: RequestRecord) -> float | None:
    """Time to first token, from when the load pattern said to send the request.

    Formula: (t_first_chunk_with_tokens − scheduled_ns) / 1e6. None when no token arrived.
    """
    chunks = _token_chunks(r)
    if not chunks:
        return None
    return (chunks[0][0] - r.scheduled_ns) / NS_PER_MS


def ttft_from_send_ms(r: RequestRecord) -> float | None:
    """Time to first token, from when the driver actually sent the request.

    Formula: (t_first_chunk_with_tokens − sent_ns) / 1e6. None when no token arrived.
    """
    chunks = _token_chunks(r)
    if not chunks:
        return None
    return (chunks[0][0] - r.sent_ns) / NS_PER_MS


def tpot_ms(r: RequestRecord) -> float | None:
    """Time per output token after the first, one number per request.

    Formula: (t_last_chunk − t_first_chunk) / (n_out − 1) / 1e6, n_out = Σ chunk_tokens (a chunk
    of k tokens counts k). None when n_out < 2. A reply that arrives in one chunk gives 0.0.
    """
    chunks = _token_chunks(r)
    num_output_tokens = sum(k for _, k in chunks)
    if num_output_tokens < 2:
        return None
    return (chunks[-1][0] - chunks[0][0]) / (num_output_tokens - 1) / NS_PER_MS


def itl_samples_ms(r: RequestRecord) -> list[float]:
    """Inter-token latencies: one sample per output token after the first chunk.

    Formula: for each chunk i ≥ 1 with k_i tokens, k_i samples of (t_i − t_{i−1}) / k_i / 1e6.
    The extra tokens of the first chunk give no sample (their gap is part of TTFT), so there are
    n_out − k_first samples, summing to t_last − t_first.
    """
    chunks = _token_chunks(r)
    samples: list[float] = []
    for (t_prev, _), (t, k) in pairwise(chunks):
        samples += [(t - t_prev) / k / NS_PER_MS] * k
    return samples


def icl_samples_ms(r: RequestRecord) -> list[float]:
    """Inter-chunk latencies: the raw gaps between consecutive chunks, whatever they carry.

    Formula: for each chunk i ≥ 1, (t_i − t_{i−1}) / 1e6.
    """
    chunks = _token_chunks(r)
    return [(t - t_prev) / NS_PER_MS for (t_prev, _), (t, _) in pairwise(chunks)]


def e2e_ms(r: RequestRecord) -> float | None:
    """End-to-end latency from the scheduled send to the end of the stream.

    Formula: (end_ns − scheduled_ns) / 1e6. None when the stream never ended (end_ns == 0).
    """
    if r.end_ns == 0:
        return None
    return (r.end_ns - r.scheduled_ns) / NS_PER_MS


def e2e_from_send_ms(r: RequestRecord) -> float | None:
    """End-to-end latency from the actual send (what other tools call request latency).

    Formula: (end_ns − sent_ns) / 1e6. None when the stream never ended (end_ns == 0).
    """
    if r.end_ns == 0:
        return None
    return (r.end_ns - r.sent_ns) / NS_PER_MS


def queue_ms(r: RequestRecord) -> float:
    """The driver's own lag: how late it sent the request (a client that cannot keep up shows
    here, not as a slow server).

    Formula: (sent_ns − scheduled_ns) / 1e6.
    """
    return (r.sent_ns - r.scheduled_ns) / NS_PER_MS


def server_prompt_ms(r: RequestRecord) -> float | None:
    """The server's own time on the request's prompt, as it reported it (llama.cpp's
    `timings.prompt_ms`).

    Formula: server_timings.prompt_ms. None when the server reported none.
    """
    timings = r.server_timings
    return None if timings is None else timings.prompt_ms


def server_decode_ms_per_token(r: RequestRecord) -> float | None:
    """The server's own decode time per output token, as it reported it (llama.cpp's
    `timings.predicted_per_token_ms`).

    Formula: server_timings.decode_ms_per_token; without it, decode_ms / decode_tokens
    (decode_tokens > 0). None when the server reported neither.
    """
    timings = r.server_timings
    if timings is None:
        return None
    if timings.decode_ms_per_token is not None:
        return timings.decode_ms_per_token
    if timings.decode_ms is not None and timings.decode_tokens:
        return timings.decode_ms / timings.decode_tokens
    return None


def ttft_overhead_ms(r: RequestRecord) -> float | None:
    """What the time to first token holds beyond the server's prompt processing: its HTTP,
    templating and tokenization, queueing before its counter starts, sending the first token,
    the network and the client's parsing.

    Formula: ttft_from_send_ms(r) − server_prompt_ms(r). None when either is None.
    """
    ttft, prompt = ttft_from_send_ms(r), server_prompt_ms(r)
    return None if ttft is None or prompt is None else ttft - prompt


def tpot_overhead_ms(r: RequestRecord) -> float | None:
    """What each output token costs the client beyond the server's decode: the server's
    sampling and sending outside its counter, the network and the client's parsing.

    Formula: tpot_ms(r) − server_decode_ms_per_token(r). None when either is None.
    """
    tpot, decode = tpot_ms(r), server_decode_ms_per_token(r)
    return None if tpot is None or decode is None else tpot - decode


# The server-vs-client split: summary key → per-request value (a distribution each, or None).
SERVER_TIMINGS = {
    "server_prompt_ms": server_prompt_ms,
    "ttft_overhead_ms": ttft_overhead_ms,
    "server_decode_ms_per_token": server_decode_ms_per_token,
    "tpot_overhead_ms": tpot_overhead_ms,
}


def _worst_itl_ms(r: RequestRecord) -> float | None:
    """An ITL SLO holds for a request when every one of its token gaps is within the limit.

    Formula: max(itl_samples_ms(r)). None when the request has no ITL sample.
    """
    return max(itl_samples_ms(r), default=None)


# The one SLO table: the per-request numbers an SLO may limit ("this request's value <= limit").
# A spec's `slo:` accepts exactly these names, and each has a distribution in `summarize`.
SLO_METRICS = {
    "ttft_ms": ttft_ms,
    "ttft_from_send_ms": ttft_from_send_ms,
    "tpot_ms": tpot_ms,
    "itl_ms": _worst_itl_ms,
    "e2e_ms": e2e_ms,
    "queue_ms": queue_ms,
}


def _check_slo(slo: dict[str, float]) -> None:
    for name in slo:
        if name not in SLO_METRICS:
            known = ", ".join(SLO_METRICS)
            raise UserError(f"unknown SLO metric {name!r}; use one of: {known}")


def is_slo_met(r: RequestRecord, slo: dict[str, float]) -> bool:
    """Whether a request completed and each SLO'd value is within its limit.

    Formula: r.ok and all(value(r) <= limit for each (name, limit) in slo). A value that is
    undefined for a completed request (the TPOT of a 1-token reply) does not break its SLO,
    as in vLLM's goodput. A failed request never meets an SLO.
    """
    _check_slo(slo)
    if not r.ok:
        return False
    for name, limit in slo.items():
        value = SLO_METRICS[name](r)
        if value is not None and value > limit:
            return False
    return True


# --- aggregates -------------------------------------------------------------------------------


def percentile(values: Iterable[float], q: float) -> float | None:
    """The q-th percentile (0 ≤ q ≤ 100), interpolating linearly between the closest ranks.

    Formula: with x sorted and h = (n − 1) · q / 100, x[⌊h⌋] + (h − ⌊h⌋) · (x[⌊h⌋+1] − x[⌊h⌋]);
    computed by numpy.percentile(x, q, method="linear") (numpy's default, Hyndman & Fan type 7).
    None for no values.
    """
    if not 0 <= q <= 100:
        raise ValueError(f"percentile q must be in [0, 100], got {q}")
    xs = np.fromiter(values, dtype=np.float64)
    if xs.size == 0:
        return None
    return float(np.percentile(xs, q, method="linear"))


def distribution(values: Iterable[float]) -> dict[str, float | int | None]:
    """Mean, p50, p90, p95, p99, max and count of the values (all None and count 0 if empty).

    Formula: mean = Σ x / n; pXX = percentile(x, XX); max = max(x).
    """
    xs = list(values)
    if not xs:
        return {"mean": None, **{f"p{q}": None for q in PERCENTILES}, "max": None, "count": 0}
    return {
        "mean": math.fsum(xs) / len(xs),
        **{f"p{q}": percentile(xs, q) for q in PERCENTILES},
        "max": float(max(xs)),
        "count": len(xs),
    }


def _mean(values: Iterable[float | None]) -> float | None:
    xs = [x for x in values if x is not None]
    return math.fsum(xs) / len(xs) if xs else None


def _per_s(count: float, duration_s: float) -> float | None:
    return count / duration_s if duration_s > 0 else None


def _guidellm_tpot_ms(r: RequestRecord) -> float | None:
    """GuideLLM's "time per output token": from the actual send to the last token, per token.

    Formula: (t_last_chunk − sent_ns) / n_out / 1e6. None when no token arrived.
    """
    chunks = _token_chunks(r)
    num_output_tokens = sum(k for _, k in chunks)
    if num_output_tokens == 0:
        return None
    return (chunks[-1][0] - r.sent_ns) / num_output_tokens / NS_PER_MS


def cache_hit_rate(completed: Sequence[RequestRecord]) -> float | None:
    """Σ cached_tokens / Σ prompt tokens over the requests that report cached_tokens (the
    server's prompt count when given, since the cached count is the server's); None when none
    reports it."""
    reporting = [r for r in completed if r.cached_tokens is not None]
    denominator = sum(
        r.server_prompt_tokens if r.server_prompt_tokens is not None else r.num_prompt_tokens
        for r in reporting
    )
    return sum(r.cached_tokens for r in reporting) / denominator if denominator > 0 else None


def endpoint_summaries(
    measured: Sequence[RequestRecord], duration_s: float, num_endpoints: int = 0
) -> list[dict]:
    """One entry per endpoint of a routed run (`backend.urls`, by index; all `num_endpoints` of
    them, an endpoint sent nothing included), over its measured requests: requests, failed,
    prefix-cache hit rate, TTFT and TPOT p50 of the completed, and the requests it held in
    flight on average.

    Formula: mean_in_flight = Σ (end_ns − sent_ns) of its requests / the run's window.
    """
    by_endpoint: dict[int, list[RequestRecord]] = {}
    for r in measured:
        if r.endpoint is not None:
            by_endpoint.setdefault(r.endpoint, []).append(r)
    out = []
    for endpoint in range(max([num_endpoints - 1, *by_endpoint]) + 1):
        mine = by_endpoint.get(endpoint, [])
        completed = [r for r in mine if r.ok]
        busy_ns = sum(max(0, r.end_ns - r.sent_ns) for r in mine if r.end_ns)
        ttfts = [v for v in map(ttft_ms, completed) if v is not None]
        tpots = [v for v in map(tpot_ms, completed) if v is not None]
        out.append(
            {
                "endpoint": endpoint,
                "requests": len(mine),
                "failed": len(mine) - len(completed),
                "prefix_cache_hit_rate": cache_hit_rate(completed),
                "ttft_ms_p50": percentile(ttfts, 50),
                "tpot_ms_p50": percentile(tpots, 50),
                "mean_in_flight": busy_ns / NS_PER_S / duration_s if duration_s > 0 else None,
            }
        )
    return out


def endpoint_imbalance(endpoints: Sequence[dict]) -> float | None:
    """How unevenly a routed run loaded its endpoints: max / mean of their `mean_in_flight`
    (1.0: even; N: all the load on one of N)."""
    loads = [e["mean_in_flight"] for e in endpoints if e["mean_in_flight"] is not None]
    mean = sum(loads) / len(loads) if loads else 0.0
    return max(loads) / mean if mean > 0 else None


def summarize(
    records: Sequence[RequestRecord], slo: dict[str, float] | None = None, num_endpoints: int = 0
) -> dict:
    """The run's summary over its measured (non-warm-up) requests (routed over `num_endpoints`
    endpoints: a line for each in `endpoints`).

    Latency distributions are over completed requests, except `queue_ms`, which is over every
    measured request (the driver lagged whether or not the server then failed).
    Formula: window = max(end_ns) − min(sent_ns) over measured requests;
    output_tok_per_s = Σ n_out(completed) / window; input_tok_per_s = Σ num_prompt_tokens
    (completed) / window; request_per_s = num_completed / window;
    goodput_request_per_s = #completed meeting every SLO / window;
    goodput_fraction = #completed meeting every SLO / #measured;
    prefix_cache_hit_rate = Σ cached_tokens / Σ prompt tokens over requests reporting
    cached_tokens (the server's prompt count when given, since the cached count is the server's).
    Rates are None when the window is empty.
    failed_fraction = num_failed / #measured (None when nothing was measured);
    failure_reasons = error text → count over the failed measured requests, most common first;
    token_count_mismatches = #completed whose server prompt count ≠ the client's, None when no
    completed request has a server count (not checked);
    server_prompt_ms, server_decode_ms_per_token, ttft_overhead_ms, tpot_overhead_ms: the
    distributions of `SERVER_TIMINGS` over completed requests, each None when no request has a
    value (the server reported no timings).
    """
    slo = slo or {}
    _check_slo(slo)
    measured = [r for r in records if not r.is_warmup]
    completed = [r for r in measured if r.ok]
    num_failed = len(measured) - len(completed)

    ended = [r.end_ns for r in measured if r.end_ns != 0]
    if measured and ended:
        duration_s = max(0, max(ended) - min(r.sent_ns for r in measured)) / NS_PER_S
    else:
        duration_s = 0.0

    def values(metric) -> list[float]:
        return [v for v in map(metric, completed) if v is not None]

    def pooled(samples) -> list[float]:
        return [x for r in completed for x in samples(r)]

    num_output_tokens = sum(r.num_output_tokens for r in completed)
    num_prompt_tokens = sum(r.num_prompt_tokens for r in completed)
    num_good = sum(is_slo_met(r, slo) for r in completed)

    prefix_cache_hit_rate = cache_hit_rate(completed)

    ttft = values(ttft_ms)
    ttft_from_send = values(ttft_from_send_ms)
    tpot = values(tpot_ms)
    itl = pooled(itl_samples_ms)
    icl = pooled(icl_samples_ms)
    output_tok_per_s = _per_s(num_output_tokens, duration_s)
    request_per_s = _per_s(len(completed), duration_s)
    mean_request_latency_ms = _mean(values(e2e_from_send_ms))

    checked = [r for r in completed if r.server_prompt_tokens is not None]
    reasons: dict[str, int] = {}
    for r in measured:
        if not r.ok:
            reasons[r.error] = reasons.get(r.error, 0) + 1

    summary = {
        "ttft_ms": distribution(ttft),
        "ttft_from_send_ms": distribution(ttft_from_send),
        "tpot_ms": distribution(tpot),
        "itl_ms": distribution(itl),
        "icl_ms": distribution(icl),
        "e2e_ms": distribution(values(e2e_ms)),
        "queue_ms": distribution(queue_ms(r) for r in measured),
        "output_tok_per_s": output_tok_per_s,
        "input_tok_per_s": _per_s(num_prompt_tokens, duration_s),
        "request_per_s": request_per_s,
        "num_completed": len(completed),
        "num_failed": num_failed,
        "duration_s": duration_s,
        "goodput_request_per_s": _per_s(num_good, duration_s),
        "goodput_fraction": num_good / len(measured) if measured else None,
        "prefix_cache_hit_rate": prefix_cache_hit_rate,
        "token_count_mismatches": (
            sum(r.server_prompt_tokens != r.num_prompt_tokens for r in checked) if checked else None
        ),
        "failed_fraction": num_failed / len(measured) if measured else None,
        "failure_reasons": dict(sorted(reasons.items(), key=lambda item: -item[1])),
    }
    if num_endpoints or any(r.endpoint is not None for r in measured):  # `backend.urls`
        summary["endpoints"] = endpoint_summaries(measured, duration_s, num_endpoints)
        summary["endpoint_imbalance"] = endpoint_imbalance(summary["endpoints"])
    for name, metric in SERVER_TIMINGS.items():
        timed = values(metric)
        summary[name] = distribution(timed) if timed else None
    summary["compat"] = {
        # vLLM / SGLang `bench serve`: TTFT and latency are timed from the actual send (they have
        # no scheduled time); TPOT is ours; their ITL keeps one sample per chunk, i.e. our icl_ms.
        "vllm": {
            "mean_ttft_ms": _mean(ttft_from_send),
            "median_ttft_ms": percentile(ttft_from_send, 50),
            "p99_ttft_ms": percentile(ttft_from_send, 99),
            "mean_tpot_ms": _mean(tpot),
            "median_tpot_ms": percentile(tpot, 50),
            "p99_tpot_ms": percentile(tpot, 99),
            "mean_itl_ms": _mean(icl),
            "median_itl_ms": percentile(icl, 50),
            "p99_itl_ms": percentile(icl, 99),
            "output_throughput": output_tok_per_s,  # tok/s
            "request_throughput": request_per_s,  # req/s
        },
        # GuideLLM: TTFT from the send; its "ITL" is our tpot_ms; its "TPOT" is
        # (t_last − t_send) / n_out (see _guidellm_tpot_ms); request latency in seconds.
        "guidellm": {
            "time_to_first_token_ms": _mean(ttft_from_send),
            "inter_token_latency_ms": _mean(tpot),
            "time_per_output_token_ms": _mean(map(_guidellm_tpot_ms, completed)),
            "request_latency_s": (
                None if mean_request_latency_ms is None else mean_request_latency_ms / 1e3
            ),
        },
        # AIPerf / GenAI-Perf (all in ms): TTFT and request latency from the send; its "ITL" is
        # our tpot_ms; its "ICL" is our icl_ms; output token throughput in tok/s.
        "aiperf": {
            "time_to_first_token": _mean(ttft_from_send),
            "inter_token_latency": _mean(tpot),
            "inter_chunk_latency": _mean(icl),
            "request_latency": mean_request_latency_ms,
            "output_token_throughput": output_tok_per_s,
        },
    }
    return summary
