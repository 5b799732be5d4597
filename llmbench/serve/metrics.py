"""Prometheus metrics of `llmbench serve`: latency histograms, token and request counters and
engine gauges, in one `prometheus_client` registry per app.

Every series has an `llmbench_` name; with `vllm_names` the same numbers are also exposed under
the names vLLM's Grafana dashboards read, with vLLM's `model_name` label:

| llmbench_                                  | vllm: (with --vllm-metrics)                  |
|--------------------------------------------|----------------------------------------------|
| time_to_first_token_seconds (histogram)    | time_to_first_token_seconds                  |
| time_per_output_token_seconds (per request)| request_time_per_output_token_seconds        |
| inter_token_latency_seconds (per token)    | inter_token_latency_seconds, and             |
|                                            | time_per_output_token_seconds (its old name) |
| e2e_request_latency_seconds                | e2e_request_latency_seconds                  |
| request_queue_time_seconds                 | request_queue_time_seconds                   |
| requests_total{finish_reason}              | request_success_total{finished_reason}       |
| prompt_tokens_total, generation_tokens_total | prompt_tokens_total, generation_tokens_total |
| num_requests_running, num_requests_waiting | num_requests_running, num_requests_waiting   |
| kv_cache_usage_ratio                       | kv_cache_usage_perc (also a 0-1 fraction)    |
| prefix_cache_hit_rate, generation_tokens_per_second | -                                   |
| record_written_steps_total, record_dropped_steps_total (--record) | -                       |

Times are the engine's `perf_counter_ns()` stamps against the moment the server read the
request; "per request" TPOT and "per token" ITL are the two rows of the one-name-one-number
table in `llmbench.harness.metrics`. Memory is fixed: histograms are bucket counts, and the
token rate keeps the last 10 s of outputs only.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST

CONTENT_TYPE = CONTENT_TYPE_LATEST
NS_PER_S = 1_000_000_000
RATE_WINDOW_NS = 10 * NS_PER_S  # llmbench_generation_tokens_per_second averages over 10 s
# vLLM's buckets, with finer ones below 10 ms for small models on a CPU.
REQUEST_BUCKETS_S = (
    0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
    7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
TOKEN_BUCKETS_S = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5,
    0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip

# key -> (llmbench name, vLLM names, help, buckets)
_HISTOGRAMS: dict[str, tuple[str, tuple[str, ...], str, tuple[float, ...]]] = {
    "ttft": (
        "llmbench_time_to_first_token_seconds",
        ("vllm:time_to_first_token_seconds",),
        "Request arrival to its first generated token.",
        REQUEST_BUCKETS_S,
    ),
    "tpot": (
        "llmbench_time_per_output_token_seconds",
        ("vllm:request_time_per_output_token_seconds",),
        "Per request: (last token - first token) / (output tokens - 1).",
        TOKEN_BUCKETS_S,
    ),
    "itl": (
        "llmbench_inter_token_latency_seconds",
        ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"),
        "Every gap between consecutive output tokens.",
        TOKEN_BUCKETS_S,
    ),
    "e2e": (
        "llmbench_e2e_request_latency_seconds",
        ("vllm:e2e_request_latency_seconds",),
        "Request arrival to its last token.",
        REQUEST_BUCKETS_S,
    ),
    "queue": (
        "llmbench_request_queue_time_seconds",
        ("vllm:request_queue_time_seconds",),
        "Request arrival to the first engine step that ran it.",
        REQUEST_BUCKETS_S,
    ),
}


def ttft_s(arrival_ns: int, first_token_ns: int) -> float:
    """Formula: (t_first_token - t_arrival) / 1e9."""
    return (first_token_ns - arrival_ns) / NS_PER_S


def tpot_s(first_token_ns: int, last_token_ns: int, num_output_tokens: int) -> float | None:
    """Formula: (t_last_token - t_first_token) / (n_out - 1) / 1e9; None when n_out < 2."""
    if num_output_tokens < 2:
        return None
    return (last_token_ns - first_token_ns) / (num_output_tokens - 1) / NS_PER_S


def itl_samples_s(previous_ns: int, t_ns: int, num_tokens: int) -> list[float]:
    """Formula: an output of k tokens a gap g after the previous one gives k samples of g / k
    (/ 1e9), so a multi-token output neither inflates the latency nor hides tokens."""
    return [(t_ns - previous_ns) / num_tokens / NS_PER_S] * num_tokens


class RecentTokenRate:
    """Tokens per second over a sliding window of the most recent `window_ns`.

    Holds one entry per output of the window: bounded by the engine's output rate x window.
    """

    def __init__(self, window_ns: int, start_ns: int) -> None:
        self.window_ns = window_ns
        self.start_ns = start_ns
        self._events: collections.deque[tuple[int, int]] = collections.deque()  # (t_ns, tokens)
        self._num_tokens = 0  # sum over _events

    def add(self, t_ns: int, num_tokens: int) -> None:
        if num_tokens:
            self._events.append((t_ns, num_tokens))
            self._num_tokens += num_tokens
        self._drop_before(t_ns - self.window_ns)

    def per_s(self, now_ns: int) -> float:
        """Formula: tokens with t_ns > now_ns - W / (W / 1e9), W = min(window_ns, now_ns -
        start_ns), so a server younger than the window is not under-reported."""
        self._drop_before(now_ns - self.window_ns)
        window_ns = min(self.window_ns, now_ns - self.start_ns)
        return self._num_tokens * 1e9 / window_ns if window_ns > 0 else 0.0

    def _drop_before(self, t_ns: int) -> None:
        while self._events and self._events[0][0] <= t_ns:
            self._num_tokens -= self._events.popleft()[1]


class ServeMetrics:
    """The app's registry, and what feeds it: `count_output` for every engine output, a
    `RequestClock` per request for the latencies."""

    def __init__(
        self, engine: Any, model_name: str, vllm_names: bool, recorder: Any = None
    ) -> None:
        """`engine` is the `LLMEngine` whose scheduler and blocks the gauges read; `recorder`
        (`--record`'s `StepRecorder`, or None) the one whose step counts are exposed."""
        self.registry = CollectorRegistry()
        labels = {"model_name": model_name}
        self._histograms: dict[str, list[Any]] = {}
        for key, (name, vllm, help_text, buckets) in _HISTOGRAMS.items():
            series: list[Any] = [
                Histogram(name, help_text, buckets=buckets, registry=self.registry)
            ]
            if vllm_names:
                series += [
                    Histogram(
                        v, help_text, ["model_name"], buckets=buckets, registry=self.registry
                    ).labels(**labels)
                    for v in vllm
                ]
            self._histograms[key] = series

        def counters(name: str, help_text: str) -> list[Any]:
            series: list[Any] = [Counter(f"llmbench_{name}", help_text, registry=self.registry)]
            if vllm_names:
                counter = Counter(f"vllm:{name}", help_text, ["model_name"], registry=self.registry)
                series.append(counter.labels(**labels))
            return series

        self._prompt_tokens = counters("prompt_tokens_total", "Prompt tokens of ended requests.")
        self._generation_tokens = counters("generation_tokens_total", "Tokens generated.")
        self._requests = Counter(
            "llmbench_requests_total",
            "Requests ended, by the engine's finish reason (stop, length, abort).",
            ["finish_reason"],
            registry=self.registry,
        )
        self._vllm_requests = None
        if vllm_names:
            self._vllm_requests = Counter(
                "vllm:request_success_total",
                "Requests ended, by the engine's finish reason (stop, length, abort).",
                ["finished_reason", "model_name"],
                registry=self.registry,
            )
        self.model_name = model_name
        self.generation_rate = RecentTokenRate(RATE_WINDOW_NS, time.perf_counter_ns())
        self.registry.register(_EngineGauges(engine, model_name, vllm_names, self.generation_rate))
        if recorder is not None:
            self.registry.register(_RecorderCounters(recorder))

    def exposition(self) -> bytes:
        """The registry in Prometheus' text format."""
        return generate_latest(self.registry)

    def count_output(self, output: Any) -> None:
        """Every engine output (a `RequestOutput`), on the event loop: token and request counts."""
        num_tokens = len(output.new_token_ids)
        self.generation_rate.add(output.t_ns, num_tokens)
        for counter in self._generation_tokens:
            counter.inc(num_tokens)
        if output.finished:
            for counter in self._prompt_tokens:
                counter.inc(output.num_prompt_tokens)
            self._requests.labels(finish_reason=output.finish_reason).inc()
            if self._vllm_requests is not None:
                self._vllm_requests.labels(
                    finished_reason=output.finish_reason, model_name=self.model_name
                ).inc()

    def observe(self, key: str, values_s: list[float]) -> None:
        for histogram in self._histograms[key]:
            for value in values_s:
                histogram.observe(value)

    def clock(self, arrival_ns: int) -> RequestClock:
        return RequestClock(self, arrival_ns)


class RequestClock:
    """One request's times; observes TTFT, ITL and queue time as outputs come, E2E and TPOT
    when it ends. Its state is four integers."""

    def __init__(self, metrics: ServeMetrics, arrival_ns: int) -> None:
        self._metrics = metrics
        self.arrival_ns = arrival_ns
        self.first_token_ns = 0
        self.last_token_ns = 0
        self.num_tokens = 0
        self._is_queue_observed = False

    def on_output(self, output: Any) -> None:
        if not self._is_queue_observed and output.first_scheduled_ns:
            self._is_queue_observed = True
            queue_s = max(0, output.first_scheduled_ns - self.arrival_ns) / NS_PER_S
            self._metrics.observe("queue", [queue_s])
        num_tokens = len(output.new_token_ids)
        if not num_tokens:
            return
        if self.num_tokens == 0:
            self.first_token_ns = output.t_ns
            self._metrics.observe("ttft", [ttft_s(self.arrival_ns, output.t_ns)])
        else:
            self._metrics.observe("itl", itl_samples_s(self.last_token_ns, output.t_ns, num_tokens))
        self.last_token_ns = output.t_ns
        self.num_tokens += num_tokens

    def on_finish(self, end_ns: int) -> None:
        self._metrics.observe("e2e", [(end_ns - self.arrival_ns) / NS_PER_S])
        tpot = tpot_s(self.first_token_ns, self.last_token_ns, self.num_tokens)
        if tpot is not None:
            self._metrics.observe("tpot", [tpot])


class _EngineGauges:
    """The gauges, read from the engine at scrape time (a custom collector)."""

    def __init__(
        self, engine: Any, model_name: str, vllm_names: bool, rate: RecentTokenRate
    ) -> None:
        self._engine = engine
        self._model_name = model_name
        self._vllm_names = vllm_names
        self._rate = rate

    def collect(self) -> list[GaugeMetricFamily]:
        engine = self._engine
        # Plain reads of lengths and ints the engine thread updates: each is atomic under the
        # GIL, and a scrape a step out of date is fine.
        values: list[tuple[str, str | None, str, Callable[[], float]]] = [
            ("llmbench_num_requests_running", "vllm:num_requests_running",
             "Requests in the running batch.", lambda: len(engine.scheduler.running)),
            ("llmbench_num_requests_waiting", "vllm:num_requests_waiting",
             "Requests queued for admission.", lambda: len(engine.scheduler.waiting)),
            ("llmbench_kv_cache_usage_ratio", "vllm:kv_cache_usage_perc",
             "KV blocks in use / KV blocks in all (0-1).",
             lambda: engine.blocks.num_used_blocks / engine.blocks.num_blocks),
            ("llmbench_prefix_cache_hit_rate", None,
             "Prompt tokens served from the prefix cache / prompt tokens admitted.",
             lambda: engine.prefix_cache_hit_rate),
            ("llmbench_generation_tokens_per_second", None,
             "Tokens generated per second over the last 10 s.",
             lambda: self._rate.per_s(time.perf_counter_ns())),
        ]  # fmt: skip
        families = []
        for name, vllm_name, help_text, read in values:
            value = float(read())
            families.append(GaugeMetricFamily(name, help_text, value=value))
            if self._vllm_names and vllm_name is not None:
                family = GaugeMetricFamily(vllm_name, help_text, labels=["model_name"])
                family.add_metric([self._model_name], value)
                families.append(family)
        return families


class _RecorderCounters:
    """`--record`'s steps written and dropped, read from the recorder at scrape time."""

    def __init__(self, recorder: Any) -> None:
        self._recorder = recorder

    def collect(self) -> list[CounterMetricFamily]:
        recorder = self._recorder
        return [
            CounterMetricFamily(
                "llmbench_record_written_steps",
                "--record: engine steps written to steps.jsonl.",
                value=recorder.num_written,
            ),
            CounterMetricFamily(
                "llmbench_record_dropped_steps",
                "--record: engine steps not written (the disk fell behind, a write failed).",
                value=recorder.num_dropped,
            ),
        ]
