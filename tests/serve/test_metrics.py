"""Tests for llmbench.serve.metrics: the latency formulas by hand, and the registry read
back through prometheus_client's own text parser."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from prometheus_client.parser import text_string_to_metric_families

from llmbench.engine.records import RequestOutput
from llmbench.serve.metrics import RecentTokenRate, ServeMetrics, itl_samples_s, tpot_s, ttft_s

MS = 1_000_000  # ns


def fake_engine(running: int = 0, waiting: int = 0, used_blocks: int = 0):
    """What the gauges read: scheduler queues, block counts, the prefix-cache hit rate."""
    return SimpleNamespace(
        scheduler=SimpleNamespace(running=[None] * running, waiting=[None] * waiting),
        blocks=SimpleNamespace(num_used_blocks=used_blocks, num_blocks=8),
        prefix_cache_hit_rate=0.25,
    )


def output(t_ms: float, num_tokens: int = 1, reason: str | None = None, scheduled_ms: float = 0):
    return RequestOutput(
        request_id="r",
        new_token_ids=(7,) * num_tokens,
        new_text="x" * num_tokens,
        t_ns=round(t_ms * MS),
        finished=reason is not None,
        finish_reason=reason,
        num_prompt_tokens=5,
        num_cached_tokens=0,
        first_scheduled_ns=round(scheduled_ms * MS),
    )


def samples(metrics: ServeMetrics) -> dict[tuple[str, tuple], float]:
    text = metrics.exposition().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_formulas_by_hand():
    assert ttft_s(1_000 * MS, 1_250 * MS) == 0.25
    assert tpot_s(100 * MS, 400 * MS, 4) == pytest.approx(0.1)  # 300 ms over 3 gaps
    assert tpot_s(100 * MS, 100 * MS, 1) is None
    assert itl_samples_s(100 * MS, 130 * MS, 3) == pytest.approx([0.01, 0.01, 0.01])


def test_recent_token_rate_over_the_window():
    second = 10**9
    rate = RecentTokenRate(window_ns=10 * second, start_ns=0)
    assert rate.per_s(0) == 0.0
    rate.add(1 * second, 4)
    rate.add(3 * second, 6)
    assert rate.per_s(5 * second) == 10 / 5  # younger than the window: divide by the age
    assert rate.per_s(12 * second) == 6 / 10  # the t=1 s tokens left the window at 11 s
    assert rate.per_s(14 * second) == 0.0


def test_one_request_lands_in_the_right_buckets():
    metrics = ServeMetrics(fake_engine(running=2, waiting=1, used_blocks=2), "m", False)
    clock = metrics.clock(arrival_ns=1_000 * MS)
    # Scheduled 3 ms after arrival, first token at +30 ms, then one of 2 tokens at +50 ms.
    for out in (output(1_030, scheduled_ms=1_003), output(1_050, 2, "stop", 1_003)):
        metrics.count_output(out)
        clock.on_output(out)
    clock.on_finish(1_050 * MS)
    s = samples(metrics)
    histogram = "llmbench_time_to_first_token_seconds"
    assert s[(histogram + "_bucket", (("le", "0.02"),))] == 0
    assert s[(histogram + "_bucket", (("le", "0.04"),))] == 1
    assert s[(histogram + "_sum", ())] == pytest.approx(0.030)
    assert s[("llmbench_request_queue_time_seconds_sum", ())] == pytest.approx(0.003)
    assert s[("llmbench_inter_token_latency_seconds_count", ())] == 2  # 2 tokens, 10 ms each
    assert s[("llmbench_inter_token_latency_seconds_sum", ())] == pytest.approx(0.020)
    assert s[("llmbench_time_per_output_token_seconds_sum", ())] == pytest.approx(0.010)  # 20/2
    assert s[("llmbench_e2e_request_latency_seconds_sum", ())] == pytest.approx(0.050)
    assert s[("llmbench_generation_tokens_total", ())] == 3
    assert s[("llmbench_prompt_tokens_total", ())] == 5  # counted once, at the end
    assert s[("llmbench_requests_total", (("finish_reason", "stop"),))] == 1
    assert s[("llmbench_num_requests_running", ())] == 2
    assert s[("llmbench_num_requests_waiting", ())] == 1
    assert s[("llmbench_kv_cache_usage_ratio", ())] == 0.25
    assert s[("llmbench_prefix_cache_hit_rate", ())] == 0.25
    assert s[("llmbench_generation_tokens_per_second", ())] == 0  # t_ns is long ago here
    assert not any(name.startswith("vllm:") for name, _ in s)


VLLM_NAMES = {
    "vllm:time_to_first_token_seconds": "histogram",
    "vllm:time_per_output_token_seconds": "histogram",
    "vllm:request_time_per_output_token_seconds": "histogram",
    "vllm:inter_token_latency_seconds": "histogram",
    "vllm:e2e_request_latency_seconds": "histogram",
    "vllm:request_queue_time_seconds": "histogram",
    "vllm:num_requests_running": "gauge",
    "vllm:num_requests_waiting": "gauge",
    "vllm:kv_cache_usage_perc": "gauge",
    "vllm:prompt_tokens": "counter",  # the parser names counters without _total
    "vllm:generation_tokens": "counter",
    "vllm:request_success": "counter",
}


def test_vllm_names_carry_the_same_numbers_with_a_model_name_label():
    metrics = ServeMetrics(fake_engine(running=3), "served", vllm_names=True)
    clock = metrics.clock(arrival_ns=0)
    for out in (output(10), output(15), output(30, 1, "length")):
        metrics.count_output(out)
        clock.on_output(out)
    clock.on_finish(30 * MS)
    text = metrics.exposition().decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    for name, kind in VLLM_NAMES.items():
        assert families[name].type == kind, name
        assert all(s.labels.get("model_name") == "served" for s in families[name].samples), name
    s = samples(metrics)
    label = (("model_name", "served"),)
    assert s[("vllm:num_requests_running", label)] == 3
    assert s[("vllm:generation_tokens_total", label)] == 3
    assert s[("vllm:time_to_first_token_seconds_sum", label)] == pytest.approx(0.010)
    # time_per_output_token is vLLM's old name of the per-token latency: 5 ms and 15 ms.
    assert s[("vllm:time_per_output_token_seconds_sum", label)] == pytest.approx(0.020)
    assert s[("vllm:request_time_per_output_token_seconds_sum", label)] == pytest.approx(0.010)
    success = (("finished_reason", "length"), ("model_name", "served"))
    assert s[("vllm:request_success_total", success)] == 1


def test_each_app_has_its_own_registry():
    first, second = ServeMetrics(fake_engine(), "a", True), ServeMetrics(fake_engine(), "b", True)
    first.count_output(output(1, 4, "stop"))
    assert samples(first)[("llmbench_generation_tokens_total", ())] == 4
    assert samples(second)[("llmbench_generation_tokens_total", ())] == 0
