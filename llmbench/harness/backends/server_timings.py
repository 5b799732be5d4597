"""What a server says about its own work on a request: its `usage` counts and its timings.

Shapes read (each from any chunk of a stream, or a whole response; the last one wins, since
every server that repeats them sends running totals):

- OpenAI `usage`: `prompt_tokens`, `completion_tokens`, `prompt_tokens_details.cached_tokens`
  (vLLM with --enable-prompt-tokens-details, SGLang with --enable-cache-report, OpenAI, recent
  llama.cpp), DeepSeek's `prompt_cache_hit_tokens`. TGI sends `"usage": null` on every chunk
  but the last: null or empty is no report.
- vLLM's `continuous_usage_stats`: `usage` on every chunk with the running totals. Read like
  the last-only shape (never summed); its per-chunk counts are the stream parser's business.
- llama.cpp's `timings`: `prompt_n` tokens evaluated in `prompt_ms` (those not found in its
  cache: `cache_n`), `predicted_n` generated in `predicted_ms`, `predicted_per_token_ms`.
"""

from __future__ import annotations

import math
from typing import Any

from llmbench.harness.records import ServerTimings

LLAMA_CPP = "llama.cpp timings"
OPENAI_USAGE = "openai usage"
CONTINUOUS_USAGE = "vllm continuous_usage_stats"


class ServerReport:
    """Collects `usage` and `timings` from the chunks of one reply."""

    def __init__(self) -> None:
        self.usage: dict[str, Any] | None = None  # the last non-empty `usage` object
        self.timings: dict[str, Any] | None = None  # the last non-empty `timings` object

    def read(self, chunk: dict[str, Any]) -> None:
        usage = chunk.get("usage")
        if isinstance(usage, dict) and usage:
            self.usage = usage
        timings = chunk.get("timings")
        if isinstance(timings, dict) and timings:
            self.timings = timings

    @property
    def prompt_tokens(self) -> int | None:
        """`usage.prompt_tokens`."""
        return _count((self.usage or {}).get("prompt_tokens"))

    @property
    def completion_tokens(self) -> int | None:
        """`usage.completion_tokens`."""
        return _count((self.usage or {}).get("completion_tokens"))

    @property
    def reasoning_tokens(self) -> int | None:
        """`usage.completion_tokens_details.reasoning_tokens` (OpenAI's, vLLM's with a
        reasoning parser): the part of completion_tokens that was reasoning."""
        details = (self.usage or {}).get("completion_tokens_details")
        return _count(details.get("reasoning_tokens")) if isinstance(details, dict) else None

    def server_timings(self, is_continuous: bool = False) -> ServerTimings | None:
        """Everything reported, as one `ServerTimings`; None when nothing was.
        `is_continuous`: the usage came on every chunk that carried output."""
        return server_timings(self.usage, self.timings, is_continuous)


def server_timings(
    usage: dict[str, Any] | None, timings: dict[str, Any] | None, is_continuous: bool = False
) -> ServerTimings | None:
    """The server's numbers from its `usage` and `timings` objects (either may be None).

    Formula: prompt_ms = timings.prompt_ms; decode_ms = timings.predicted_ms;
    decode_ms_per_token = timings.predicted_per_token_ms; prompt_tokens = timings.prompt_n +
    timings.cache_n, else usage.prompt_tokens; decode_tokens = timings.predicted_n, else
    usage.completion_tokens; cached_tokens = timings.cache_n, else
    usage.prompt_tokens_details.cached_tokens, else usage.prompt_cache_hit_tokens. A value that
    is missing, null, negative or not a number is None. None when neither object gave anything.
    """
    usage, timings = usage or {}, timings or {}
    details = usage.get("prompt_tokens_details")
    usage_cached = _count(details.get("cached_tokens")) if isinstance(details, dict) else None
    if usage_cached is None:
        usage_cached = _count(usage.get("prompt_cache_hit_tokens"))
    prompt_n, cache_n = _count(timings.get("prompt_n")), _count(timings.get("cache_n"))
    predicted_n = _count(timings.get("predicted_n"))
    times = [
        _ms(timings.get(key)) for key in ("prompt_ms", "predicted_ms", "predicted_per_token_ms")
    ]
    usage_prompt = _count(usage.get("prompt_tokens"))
    usage_completion = _count(usage.get("completion_tokens"))
    sources = []
    if any(v is not None for v in (*times, prompt_n, predicted_n, cache_n)):
        sources.append(LLAMA_CPP)
    if any(v is not None for v in (usage_prompt, usage_completion, usage_cached)):
        sources.append(CONTINUOUS_USAGE if is_continuous else OPENAI_USAGE)
    if not sources:
        return None
    prompt_ms, decode_ms, decode_ms_per_token = times
    return ServerTimings(
        source=" + ".join(sources),
        prompt_ms=prompt_ms,
        decode_ms=decode_ms,
        decode_ms_per_token=decode_ms_per_token,
        prompt_tokens=usage_prompt if prompt_n is None else prompt_n + (cache_n or 0),
        decode_tokens=usage_completion if predicted_n is None else predicted_n,
        cached_tokens=usage_cached if cache_n is None else cache_n,
    )


def _ms(value: Any) -> float | None:
    """A duration or count as JSON gives it: a finite number >= 0, else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) and value >= 0 else None


def _count(value: Any) -> int | None:
    """A token count (a whole number, 12 or 12.0), else None."""
    number = _ms(value)
    return int(number) if number is not None and number.is_integer() else None
