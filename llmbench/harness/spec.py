"""`RunSpec`: one YAML file says everything a run needs, checked strictly on the way in.

This module is the schema: frozen dataclasses, one per section, with their defaults. Each
workload kind and load mode is its own dataclass, chosen by `kind`, so a key of another kind is
refused: `x.yaml:9: workload.zipf_s: not a field of chat workloads (it belongs to rag
workloads)`. Reading and checking a YAML (unknown keys, wrong types, impossible values, each
with the file, key path and line; `--set key.path=value` overrides) is `spec_load`'s.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, Literal

from llmbench.harness.yaml_source import SpecError


@dataclass(frozen=True)
class Dist:
    """A length or delay distribution: fixed, uniform, normal, lognormal or empirical."""

    dist: Literal["fixed", "uniform", "normal", "lognormal", "empirical"] = "fixed"
    value: float | None = None  # fixed
    min: float | None = None  # uniform (and a floor for normal / lognormal)
    max: float | None = None  # uniform (and a ceiling for normal / lognormal)
    mean: float | None = None  # normal, lognormal (the mean of the distribution itself)
    std: float | None = None  # normal
    sigma: float | None = None  # lognormal: std of the underlying normal
    values: tuple[float, ...] | None = None  # empirical: drawn uniformly from these

    @classmethod
    def of_number(cls, value: float) -> Dist:
        """A bare number in a spec (`output_tokens: 64`): that value, fixed."""
        return cls(dist="fixed", value=value)

    def check(self, path: str) -> None:
        required = {
            "fixed": ("value",),
            "uniform": ("min", "max"),
            "normal": ("mean", "std"),
            "lognormal": ("mean", "sigma"),
            "empirical": ("values",),
        }[self.dist]
        for name in required:
            if getattr(self, name) is None:
                raise SpecError(f"{path}.{name}", f"required for dist '{self.dist}'")
        if self.dist == "uniform" and self.min > self.max:
            raise SpecError(f"{path}.min", f"must be <= max ({self.max}), got {self.min}")
        if self.dist == "empirical" and not self.values:
            raise SpecError(f"{path}.values", "must be a non-empty list")
        for name in ("value", "min", "max", "mean", "std", "sigma"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise SpecError(f"{path}.{name}", f"must be >= 0, got {value}")
        if self.values and any(v < 0 for v in self.values):
            raise SpecError(f"{path}.values", "must all be >= 0")


def fixed(value: float) -> Dist:
    return Dist.of_number(value)


@dataclass(frozen=True)
class BackendSpec:
    kind: Literal["engine", "openai", "transformers"] = "engine"
    url: str | None = None  # openai: base URL, e.g. http://127.0.0.1:8000/v1
    # openai: several base URLs of replicas of one model instead of `url`, each request sent to
    # the one `routing` chooses.
    urls: tuple[str, ...] = ()
    api: Literal["chat", "completions"] = "chat"
    served_model: str | None = None  # openai: the model name to ask for (default: the first)
    timeout_s: float = 600.0
    # openai: what the server runs on, for its estimated roofline: "measured" (this machine's
    # measured CPU roofs: a server on loopback) or a datasheet name such as "h100-sxm".
    hardware: str | None = None
    # openai: how the server stores its weights, for the bytes of its estimated roofline: a
    # storage name of `cost_model.BYTES_PER_ELEM` ("q4_1", "int8", "fp8", "bfloat16", ...) or
    # bytes per parameter; neither: unknown (the bytes then assume `dtype`, and say so).
    weights: str | None = None
    weights_bytes_per_param: float | None = None
    # openai: extra HTTP headers sent with every request (they are kept in results.json with
    # the spec: no secrets here), and a header to send a fresh UUID4 in per request (e.g.
    # "X-Request-Id"); none by default, as a server may refuse ids it did not expect.
    headers: dict[str, str] = field(default_factory=dict)
    request_id_header: str | None = None
    # openai: the server's log file (its stderr), for servers that print their per-request
    # timings there instead of sending them (llama-cpp-python's server prints llama.cpp's
    # perf blocks); what it writes during the run is read at the end and matched to requests.
    server_log: str | None = None
    # Empty the prefix cache of the engine or of every server (`POST /reset_prefix_cache`, or
    # SGLang's `/flush_cache`) before each measured repetition, after the warm-up: each starts
    # cold, and variants run one after another against the same servers compare fairly.
    reset_prefix_cache: bool = False

    @property
    def addresses(self) -> list[str]:
        """The server base URLs a run sends to: `urls`, else `url` ([] for the engine)."""
        return list(self.urls) or ([self.url] if self.url else [])


@dataclass(frozen=True)
class RoutingSpec:
    """How requests are spread over `backend.urls` (`harness.routing`): the policy, the prompt
    block that prefix affinity hashes, its load cap and least match, and how long a failed
    endpoint is skipped."""

    policy: Literal["round_robin", "least_loaded", "prefix_affinity", "session_sticky"] = (
        "round_robin"
    )
    block_tokens: int = 16
    max_imbalance: int = 2  # prefix affinity: requests in flight above the least loaded
    # prefix affinity: the share of a prompt a known prefix must cover to route by it
    min_match: float = 0.5
    down_s: float = 5.0


# A K/V cache storage format: auto (the model's dtype), a float dtype, int8 or int4.
KVFormat = Literal["auto", "float32", "bfloat16", "float16", "int8", "int4"]


@dataclass(frozen=True)
class KVCacheDtypeSpec:
    """The K/V cache's storage, keys (`k`) and values (`v`) apart."""

    k: KVFormat = "auto"
    v: KVFormat = "auto"


@dataclass(frozen=True)
class SpeculativeSpec:
    """Speculative decoding in the built-in engine: `none`, `ngram` (prompt lookup: copy what
    followed the longest recent n-gram, n from `ngram_max` down to `ngram_min`), or `draft` (a
    draft model with the target's tokenizer: a model name, or the target made cheaper:
    `self:layers=N`, its own first N layers, `self:quantize=SCHEME`, a quantised copy, or
    both, `self:layers=N,quantize=SCHEME`). `adaptive`: each step verifies only the drafts
    worth their measured cost (`engine.draft_budget`)."""

    method: Literal["none", "ngram", "draft"] = "none"
    num_tokens: int = 4  # k: draft tokens verified per sequence and step (adaptive: at most)
    ngram_min: int = 2
    ngram_max: int = 4
    draft_model: str | None = None
    adaptive: bool = False


@dataclass(frozen=True)
class MoEOffloadSpec:
    """Expert offloading in the built-in engine (mixture-of-experts models): `resident` experts
    per layer stay in device memory, the others are fetched over the host link when routed to,
    the last `cache` fetched kept per layer (LRU). `link`: a host link of the hardware table
    (pcie3-x16, pcie4-x16, pcie5-x16, or pcie3 / pcie4 / pcie5), a bandwidth (`25GB/s`), both
    simulated, or `real` (CUDA: copies from pinned host memory); default: pcie4-x16 simulated
    on a CPU, real on CUDA. `profile`: an experts.json whose most-routed experts stay resident
    (default: the first `resident` ids). `sleep`: a simulated link also sleeps its time."""

    resident: int = 0
    cache: int = 0
    link: str | None = None
    profile: str | None = None
    sleep: bool = False


@dataclass(frozen=True)
class EngineSpec:
    block_size: int = 16
    max_num_batched_tokens: int = 2048
    max_num_seqs: int = 64
    prefix_caching: bool = True
    kv_cache_memory: float | None = None
    threads: int | None = None
    # One format for keys and values (`int8`), or each its own (`{k: bfloat16, v: int8}`).
    kv_cache_dtype: KVFormat | KVCacheDtypeSpec = "auto"
    speculative: SpeculativeSpec = field(default_factory=SpeculativeSpec)
    # Weight-only quantization of the linear layers at load: int8, int4[:group][:sym]; null
    # or none: the weights stay in `dtype`.
    quantize: str | None = None
    # Mixture of experts: offload all but `resident` experts per layer (null: all resident).
    moe_offload: MoEOffloadSpec | None = None
    # CPU: the weights and the K/V cache on 2 MiB pages where the OS gives them (false: torch's
    # own allocations, 4 KiB pages on most machines).
    huge_pages: bool = True


@dataclass(frozen=True)
class _Workload:
    """The fields every workload kind has; each kind below adds its own."""

    kind: str
    sessions: int = 8  # conversations, queries or agent tasks
    system_prompt_tokens: int = 200  # shared by every session
    user_tokens: Dist = field(default_factory=lambda: fixed(64))  # user message / question / task
    output_tokens: Dist = field(default_factory=lambda: fixed(64))  # max_tokens of each reply


@dataclass(frozen=True)
class ChatWorkload(_Workload):
    """Multi-turn conversations: user turns after a think time, the model's replies fed back."""

    kind: Literal["chat"] = "chat"
    turns: Dist = field(default_factory=lambda: fixed(3))  # user turns per session
    think_time_s: Dist = field(default_factory=lambda: fixed(0.0))  # before each later turn


@dataclass(frozen=True)
class RagWorkload(_Workload):
    """One question per session over documents drawn from a shared corpus by popularity."""

    kind: Literal["rag"] = "rag"
    num_documents: int = 50  # corpus size
    docs_per_query: int = 3
    document_tokens: Dist = field(default_factory=lambda: fixed(300))
    zipf_s: float = 1.1  # popularity skew of the corpus


@dataclass(frozen=True)
class AgenticWorkload(_Workload):
    """Tool loops: task → (reasoning step, tool result) × tool_steps → final answer."""

    kind: Literal["agentic"] = "agentic"
    tool_schema_tokens: int = 600  # shared by every session
    tool_steps: Dist = field(default_factory=lambda: fixed(3))  # tool calls before the answer
    tool_result_tokens: Dist = field(default_factory=lambda: fixed(300))
    tool_latency_s: Dist = field(default_factory=lambda: fixed(0.2))
    final_output_tokens: Dist = field(default_factory=lambda: fixed(64))
    # text: schemas in the system prompt, results as user messages; api: schemas in the
    # request's `tools`, calls as assistant `tool_calls`, results as `tool` messages.
    tools_as: Literal["text", "api"] = "text"


WorkloadSpec = ChatWorkload | RagWorkload | AgenticWorkload


@dataclass(frozen=True)
class LoadSearch:
    """The highest load that meets the spec's SLOs, searched between `low` and `high`
    (concurrencies, or session starts a second): `low` first, then `high`, then the geometric
    middle of the highest load that met them and the lowest above it that did not, up to
    `points` runs in all (`harness.capacity`); each a point of a sweep (`point-<value>/`)."""

    low: float
    high: float
    points: int = 6


@dataclass(frozen=True)
class ConcurrencyLoad:
    """Closed loop: `concurrency` sessions in flight; the next starts when one ends."""

    kind: Literal["concurrency"] = "concurrency"
    concurrency: int = 4
    sweep: tuple[float, ...] | None = None  # concurrencies: one result per point
    search: LoadSearch | None = None  # concurrencies: the highest that meets the SLOs
    workers: int = 1  # client processes the schedule is sharded across (openai backend)


@dataclass(frozen=True)
class RateLoad:
    """Open loop: sessions start at `rate_per_s`, evenly spaced or as a Poisson process."""

    kind: Literal["constant", "poisson"] = "poisson"
    rate_per_s: float | None = None  # required unless `sweep` or `search` gives the rates
    sweep: tuple[float, ...] | None = None  # rates: one result per point
    search: LoadSearch | None = None  # rates: the highest that meets the SLOs
    workers: int = 1  # client processes the schedule is sharded across (openai backend)


@dataclass(frozen=True)
class GammaLoad:
    """Open loop with gamma-distributed gaps between session starts (shape = burstiness)."""

    kind: Literal["gamma"] = "gamma"
    rate_per_s: float | None = None  # required unless `sweep` or `search` gives the rates
    burstiness: float = 1.0  # gamma shape; 1 = Poisson, < 1 burstier
    sweep: tuple[float, ...] | None = None  # rates: one result per point
    search: LoadSearch | None = None  # rates: the highest that meets the SLOs
    workers: int = 1  # client processes the schedule is sharded across (openai backend)


@dataclass(frozen=True)
class TraceLoad:
    """Open loop replaying the session start times of a JSONL file (`timestamp` per line)."""

    kind: Literal["trace"] = "trace"
    trace: str | None = None  # required
    workers: int = 1  # client processes the schedule is sharded across (openai backend)

    @property
    def rate_per_s(self) -> None:
        """A trace's sessions start at the file's times: it has no rate."""
        return None

    @property
    def sweep(self) -> None:
        """A trace replays one schedule: it has no sweep."""
        return None

    @property
    def search(self) -> None:
        """A trace replays one schedule: it has no load to search."""
        return None


LoadSpec = ConcurrencyLoad | RateLoad | GammaLoad | TraceLoad


@dataclass(frozen=True)
class QualitySpec:
    """`llmbench quality` of the run's engine configuration (its K/V cache formats, its weight
    quantisation) against the unquantised model, measured once per run before the workload;
    the result goes to `summary.quality` of the run (of every point of a sweep)."""

    text: str | None = None  # a UTF-8 file to score; None: Python's pydoc topics and source
    tokens: int = 512  # tokens scored per text
    context: int = 512  # tokens per scored window
    generate: int = 16  # greedy tokens per prompt


# Spec keys that do not change what is measured, left out of `RunSpec.hash` (and of the keys
# `compare` names when two specs differ). How often and how strictly it is measured: `repeat`,
# `max_failed_fraction`, `quality` (a measurement beside the workload), `load.workers` (how many
# client processes send the one schedule: a sharded run hashes as the run). And the system under
# test, which is what a user changes between BASE and NEW: where the server is
# (`backend.url`), what the client sends besides the requests (`backend.headers`, API keys
# among them; `backend.request_id_header`) and where its log is read (`backend.server_log`).
NOT_THE_BENCHMARK = (
    "repeat",
    "max_failed_fraction",
    "quality",
    "prices",
    "gpu_hour_price",
    "load.workers",
    "backend.url",
    "backend.urls",
    "backend.headers",
    "backend.request_id_header",
    "backend.server_log",
)

# Spec keys added after runs were recorded without them, each with the value that does what
# runs before it did: hashed only when they hold another, so a spec that does not use them
# hashes as it did, and runs from before them still compare.
HASHED_WHEN_SET = {"load.search": None, "engine.speculative.adaptive": False}


def _holder(fields: dict[str, Any], key: str) -> tuple[dict[str, Any], str]:
    """The mapping of `fields` that holds the dotted `key` ("engine.speculative.adaptive"),
    and the key's last name in it."""
    *sections, name = key.split(".")
    return functools.reduce(lambda d, section: d[section], sections, fields), name


@dataclass(frozen=True)
class RunSpec:
    name: str = "run"
    seed: int = 0
    model: str = "smollm2-135m"
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    device: Literal["auto", "cpu", "cuda"] = "auto"
    backend: BackendSpec = field(default_factory=BackendSpec)
    routing: RoutingSpec = field(default_factory=RoutingSpec)  # with backend.urls
    engine: EngineSpec = field(default_factory=EngineSpec)
    workload: WorkloadSpec = field(default_factory=ChatWorkload)
    load: LoadSpec = field(default_factory=ConcurrencyLoad)
    warmup_requests: int = 1
    # How many times the measured phase runs on the same backend, each time with its own prompt
    # salt (the warm-up runs once): the spread between repetitions is the run's noise.
    repeat: int = 1
    slo: dict[str, float] = field(default_factory=dict)  # metrics.SLO_METRICS name → limit (ms)
    temperature: float = 0.0
    ignore_eos: bool = True  # lengths follow the spec, not the model's whims
    output_dir: str = "runs"
    # Above this fraction of failed measured requests the run is flagged loudly (`--strict`:
    # exit 1); a run where every measured request failed always exits 1.
    max_failed_fraction: float = 0.05
    # Quality of the run's engine configuration against the unquantised model (engine backend).
    quality: QualitySpec | None = None
    # A price sheet (a YAML path, or a shipped example's name: `harness.prices`) that turns the
    # run's tokens into money (`summary.cost`); None: no money shown.
    prices: str | None = None
    # What the machine serving the run costs an hour (in the price sheet's currency, USD
    # without one): the run's tokens priced at its measured throughput (`summary.self_hosted`).
    gpu_hour_price: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """The spec as plain JSON values (a tuple is a list), as results.json holds it."""
        return json.loads(json.dumps(dataclasses.asdict(self)))

    def hash(self) -> str:
        """sha256 of the canonical JSON of the spec without `NOT_THE_BENCHMARK`: two runs of
        the same hash measured the same thing, so `compare` compares them."""
        fields = self.to_dict()
        for key in NOT_THE_BENCHMARK:
            holder, name = _holder(fields, key)
            holder.pop(name, None)
        for key, unset in HASHED_WHEN_SET.items():
            holder, name = _holder(fields, key)
            if holder.get(name) == unset:
                holder.pop(name, None)
        text = json.dumps(fields, sort_keys=True, default=list)
        return hashlib.sha256(text.encode()).hexdigest()[:16]
