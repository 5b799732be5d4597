"""The server's own numbers: llama.cpp's `timings`, OpenAI `usage` and its cache details."""

from __future__ import annotations

from llmbench.harness.backends.server_timings import ServerReport, server_timings
from llmbench.harness.records import ServerTimings

# llama.cpp's final chunk: 40 prompt tokens, 30 of them from its cache (so 10 evaluated).
LLAMA_TIMINGS = {
    "cache_n": 30,
    "prompt_n": 10,
    "prompt_ms": 21.5,
    "prompt_per_token_ms": 2.15,
    "prompt_per_second": 465.1,
    "predicted_n": 16,
    "predicted_ms": 300.0,
    "predicted_per_token_ms": 18.75,
    "predicted_per_second": 53.3,
}
LLAMA_USAGE = {"completion_tokens": 16, "prompt_tokens": 40, "total_tokens": 56}


def test_llama_cpp_timings_give_every_number_and_the_prompt_counts_its_cache():
    assert server_timings(None, LLAMA_TIMINGS) == ServerTimings(
        source="llama.cpp timings",
        prompt_ms=21.5,
        decode_ms=300.0,
        decode_ms_per_token=18.75,
        prompt_tokens=40,  # prompt_n 10 evaluated + cache_n 30
        decode_tokens=16,
        cached_tokens=30,
    )


def test_timings_and_usage_together_name_both_shapes():
    timings = server_timings(LLAMA_USAGE, LLAMA_TIMINGS)
    assert timings.source == "llama.cpp timings + openai usage"
    assert (timings.prompt_tokens, timings.decode_tokens) == (40, 16)


def test_usage_alone_gives_counts_and_no_times():
    usage = {
        "prompt_tokens": 7,
        "completion_tokens": 5,
        "total_tokens": 12,
        "prompt_tokens_details": {"cached_tokens": 4},
    }
    assert server_timings(usage, None) == ServerTimings(
        source="openai usage", prompt_tokens=7, decode_tokens=5, cached_tokens=4
    )
    assert server_timings(usage, None, is_continuous=True).source == ("vllm continuous_usage_stats")


def test_cached_tokens_from_sglang_null_details_and_deepseek_hits():
    sglang = {"prompt_tokens": 9, "completion_tokens": 2, "prompt_tokens_details": None}
    assert server_timings(sglang, None).cached_tokens is None
    deepseek = {"prompt_tokens": 9, "completion_tokens": 2, "prompt_cache_hit_tokens": 6}
    assert server_timings(deepseek, None).cached_tokens == 6


def test_nothing_reported_and_values_that_are_not_numbers():
    assert server_timings(None, None) is None
    assert server_timings({}, {}) is None
    odd = {"prompt_n": "10", "prompt_ms": -1, "predicted_n": 3.5, "predicted_ms": True}
    assert server_timings(None, odd) is None
    assert server_timings(None, {"prompt_ms": 4, "prompt_n": 12.0}) == ServerTimings(
        source="llama.cpp timings", prompt_ms=4.0, prompt_tokens=12
    )


def test_the_report_keeps_the_last_non_empty_objects():
    """TGI sends `"usage": null` on every chunk but the last; vLLM's continuous usage repeats
    running totals: the last one is the reply's, never a sum."""
    report = ServerReport()
    report.read({"usage": None})
    assert report.usage is None and report.server_timings() is None
    for n in (1, 2, 3):
        report.read({"usage": {"prompt_tokens": 7, "completion_tokens": n}})
    report.read({"usage": {}, "timings": {}})
    assert (report.prompt_tokens, report.completion_tokens) == (7, 3)
    report.read({"timings": {"prompt_ms": 2.0}})
    report.read({"timings": {"prompt_ms": 5.0}})
    assert report.server_timings().prompt_ms == 5.0
