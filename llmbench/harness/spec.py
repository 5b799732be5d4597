"""`RunSpec`: one YAML file says everything a run needs, checked strictly on the way in.

Unknown keys, wrong types and impossible values are refused with the file, the key path and the
line: `workloads/x.yaml:12: load.rate_per_s: must be > 0, got -1`. Each workload kind and load
mode is its own dataclass, chosen by `kind`, so a key of another kind is refused too:
`x.yaml:9: workload.zipf_s: not a field of chat workloads (it belongs to rag workloads)`.
`--set key.path=value` overrides go through the same checks.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import string
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from llmbench.errors import UserError
from llmbench.harness import shards
from llmbench.harness.metrics import SLO_METRICS
from llmbench.harness.yaml_source import SpecError, located, read_yaml
from llmbench.roofline.cost_model import BYTES_PER_ELEM
from llmbench.roofline.datasheets import HARDWARE, datasheet, link_bandwidth


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
    return Dist(dist="fixed", value=value)


@dataclass(frozen=True)
class BackendSpec:
    kind: Literal["engine", "openai", "transformers"] = "engine"
    url: str | None = None  # openai: base URL, e.g. http://127.0.0.1:8000/v1
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
    both, `self:layers=N,quantize=SCHEME`)."""

    method: Literal["none", "ngram", "draft"] = "none"
    num_tokens: int = 4  # k: draft tokens verified per sequence and step
    ngram_min: int = 2
    ngram_max: int = 4
    draft_model: str | None = None


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
class ConcurrencyLoad:
    """Closed loop: `concurrency` sessions in flight; the next starts when one ends."""

    kind: Literal["concurrency"] = "concurrency"
    concurrency: int = 4
    sweep: tuple[float, ...] | None = None  # concurrencies: one result per point
    workers: int = 1  # client processes the schedule is sharded across (openai backend)


@dataclass(frozen=True)
class RateLoad:
    """Open loop: sessions start at `rate_per_s`, evenly spaced or as a Poisson process."""

    kind: Literal["constant", "poisson"] = "poisson"
    rate_per_s: float | None = None  # required unless `sweep` gives the rates
    sweep: tuple[float, ...] | None = None  # rates: one result per point
    workers: int = 1  # client processes the schedule is sharded across (openai backend)


@dataclass(frozen=True)
class GammaLoad:
    """Open loop with gamma-distributed gaps between session starts (shape = burstiness)."""

    kind: Literal["gamma"] = "gamma"
    rate_per_s: float | None = None  # required unless `sweep` gives the rates
    burstiness: float = 1.0  # gamma shape; 1 = Poisson, < 1 burstier
    sweep: tuple[float, ...] | None = None  # rates: one result per point
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


@dataclass(frozen=True)
class RunSpec:
    name: str = "run"
    seed: int = 0
    model: str = "smollm2-135m"
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    device: Literal["auto", "cpu", "cuda"] = "auto"
    backend: BackendSpec = field(default_factory=BackendSpec)
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

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def hash(self) -> str:
        """sha256 of the canonical JSON of the spec: same spec, same hash. `repeat` and
        `max_failed_fraction` are left out: they say how many times the workload is measured and
        how its failures are judged, not what is measured, so such runs compare; so is
        `load.workers`, how many client processes send the schedule, so that a sharded run and
        its shards hash as the run itself does. `quality` adds a measurement beside the
        workload, not a change to it: left out too; so is `backend.server_log`, where the
        server's own timings are read from."""
        fields = {
            k: v
            for k, v in self.to_dict().items()
            if k not in ("repeat", "max_failed_fraction", "quality")
        }
        fields["load"] = {k: v for k, v in fields["load"].items() if k != "workers"}
        fields["backend"] = {k: v for k, v in fields["backend"].items() if k != "server_log"}
        text = json.dumps(fields, sort_keys=True, default=list)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


# -- loading ----------------------------------------------------------------------------------


def load_spec(path: Path, overrides: list[str] = ()) -> RunSpec:
    """Read a workload YAML, apply `key.path=value` overrides, and check everything."""
    data, lines = read_spec_data(path, overrides)
    try:
        return build_spec(data)
    except SpecError as e:
        raise located(e, str(path), lines) from None


def read_spec_data(path: Path, overrides: list[str] = ()) -> tuple[dict[str, Any], dict[str, int]]:
    """A workload YAML as plain data with the `key.path=value` overrides set (not yet checked),
    and the line of every key path in it (0: set by an override)."""
    try:
        text = path.read_text()
    except OSError as e:
        raise UserError(f"{path}: cannot read ({e.strerror}); give a workload YAML") from None
    data, lines = read_yaml(text, str(path))
    data = {} if data is None else data
    if not isinstance(data, dict):
        raise UserError(f"{path}: the top level must be a mapping of keys")
    for override in overrides:
        key, raw = split_override(override, "--set")
        try:
            set_path(data, key, override_value(raw, f"--set {override}"))
        except SpecError as e:
            raise UserError(f"--set {e.path}: {e.reason}") from None
        lines[key] = 0
    return data, lines


def split_override(text: str, option: str, form: str = "key.path=value") -> tuple[str, str]:
    """`key.path=value` as typed after `option` (`--set`, `--vary`): the key and the raw value."""
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise UserError(f"{option} {text}: expected {form}")
    return key.strip(), raw


def override_value(raw: str, where: str) -> Any:
    """An override's value read as YAML (`8`, `true`, `int4:64`, `{k: int8, v: int4}`); nothing:
    null. Malformed YAML is one line naming `where`."""
    try:
        return yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError as e:
        raise UserError(f"{where}: not a YAML value ({getattr(e, 'problem', e)})") from None


def build_spec(data: dict[str, Any]) -> RunSpec:
    """Spec data (a YAML read, overrides set) as a checked `RunSpec`; a problem is a
    `SpecError` naming its key path."""
    spec = _build(RunSpec, data, "")
    _check(spec)
    return spec


def spec_from_dict(data: dict[str, Any], where: str) -> RunSpec:
    """A spec as `RunSpec.to_dict` gave it (a results file's `spec`, a worker's), checked as a
    YAML is; a problem is one line naming `where` and the key."""
    try:
        spec = _build(RunSpec, data, "")
        _check(spec)
    except SpecError as e:
        raise UserError(f"{where}: {e}") from None
    return spec


def set_path(data: dict, key: str, value: Any) -> None:
    """Set dotted `key` in spec data, making the sections on the way; a `SpecError` at `key`
    when a part of the path holds a value, not a section."""
    parts = key.split(".")
    node = data
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise SpecError(key, f"'{part}' is not a section")
        node = child
    node[parts[-1]] = value


def _build(cls: type, data: Any, path: str) -> Any:
    if not isinstance(data, dict):
        raise SpecError(path or "(top)", f"must be a mapping, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    fields = {f.name for f in dataclasses.fields(cls)}
    kwargs = {}
    for key, value in data.items():
        sub = f"{path}.{key}" if path else key
        if key not in fields:
            known = ", ".join(sorted(fields))
            raise SpecError(sub, f"unknown key; known keys here: {known}")
        kwargs[key] = _convert(hints[key], value, sub)
    return cls(**kwargs)


def _kinds(options: tuple[Any, ...]) -> dict[str, type] | None:
    """kind value → class, when `options` are dataclasses told apart by a literal `kind` field
    (the workload kinds, the load modes); None for any other union."""
    kinds: dict[str, type] = {}
    for option in options:
        if not dataclasses.is_dataclass(option) or "kind" not in {
            f.name for f in dataclasses.fields(option)
        }:
            return None
        for kind in typing.get_args(typing.get_type_hints(option)["kind"]):
            kinds[kind] = option
    return kinds


def _build_kind(kinds: dict[str, type], data: Any, path: str) -> Any:
    """The class chosen by `data["kind"]` (default: the first kind), built strictly: a key of
    another kind is named as such (`workload.zipf_s: not a field of chat workloads`)."""
    if not isinstance(data, dict):
        raise SpecError(path, f"must be a mapping, got {type(data).__name__}")
    default = next(iter(kinds.values()))().kind
    kind = data.get("kind", default)
    if kind not in kinds:
        raise SpecError(f"{path}.kind", f"must be one of {', '.join(kinds)}, got {kind!r}")
    cls = kinds[kind]
    own = {f.name for f in dataclasses.fields(cls)}
    noun = path.rpartition(".")[2] + "s"  # "workloads", "loads"
    for key in data:
        if key in own:
            continue
        owners = [k for k, c in kinds.items() if key in {f.name for f in dataclasses.fields(c)}]
        if owners:
            raise SpecError(
                f"{path}.{key}",
                f"not a field of {kind} {noun} (it belongs to {', '.join(owners)} {noun})",
            )
    return _build(cls, data, path)


def _convert(tp: Any, value: Any, path: str) -> Any:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(tp)
        if value is None and type(None) in options:
            return None
        kinds = _kinds(options)
        if kinds is not None:
            return _build_kind(kinds, value, path)
        errors = []
        for option in options:
            if option is type(None):
                continue
            try:
                return _convert(option, value, path)
            except SpecError as e:
                errors.append(e.reason)
        raise SpecError(path, errors[0] if errors else "must not be empty")
    if origin is Literal:
        choices = typing.get_args(tp)
        if value not in choices:
            raise SpecError(path, f"must be one of {', '.join(map(str, choices))}, got {value!r}")
        return value
    if origin is tuple:
        if not isinstance(value, list):
            raise SpecError(path, f"must be a list, got {type(value).__name__}")
        (item,) = typing.get_args(tp)[:1]
        return tuple(_convert(item, v, f"{path}[{i}]") for i, v in enumerate(value))
    if origin is dict:
        if not isinstance(value, dict):
            raise SpecError(path, f"must be a mapping, got {type(value).__name__}")
        _, vtype = typing.get_args(tp)
        return {str(k): _convert(vtype, v, f"{path}.{k}") for k, v in value.items()}
    if dataclasses.is_dataclass(tp):
        if isinstance(value, (int, float)) and tp is Dist:
            return fixed(value)  # shorthand: `output_tokens: 64`
        return _build(tp, value, path)
    if tp is bool:
        if not isinstance(value, bool):
            raise SpecError(path, f"must be true or false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise SpecError(path, f"must be an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise SpecError(path, f"must be a number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise SpecError(path, f"must be a string, got {value!r}")
        return value
    raise SpecError(path, f"unsupported type {tp}")


def _check(spec: RunSpec) -> None:
    """Values that are well-typed but impossible."""
    _check_workload(spec.workload)
    _check_load(spec.load)
    if spec.load.workers < 1:
        raise SpecError("load.workers", f"must be >= 1, got {spec.load.workers}")
    why = shards.problem(spec.backend.kind, spec.load, spec.workload.sessions, spec.load.workers)
    if why is not None:
        raise SpecError("load.workers", why)
    eng = spec.engine
    for path, value in {
        "engine.block_size": eng.block_size,
        "engine.max_num_batched_tokens": eng.max_num_batched_tokens,
        "engine.max_num_seqs": eng.max_num_seqs,
        "backend.timeout_s": spec.backend.timeout_s,
    }.items():
        if value <= 0:
            raise SpecError(path, f"must be > 0, got {value}")
    _check_speculative(spec)
    _check_quantize(eng.quantize)
    _check_moe_offload(spec)
    if spec.repeat < 1:
        raise SpecError("repeat", f"must be >= 1, got {spec.repeat}")
    if spec.quality is not None:
        _check_quality(spec)
    for path, value in {
        "warmup_requests": spec.warmup_requests,
        "temperature": spec.temperature,
    }.items():
        if value < 0:
            raise SpecError(path, f"must be >= 0, got {value}")
    if spec.backend.kind == "openai" and not spec.backend.url:
        raise SpecError("backend.url", "required for backend kind 'openai'")
    _check_headers(spec.backend)
    if spec.backend.server_log is not None and spec.backend.kind != "openai":
        raise SpecError("backend.server_log", "only for backend kind 'openai'")
    if spec.backend.server_log is not None and spec.load.workers > 1:
        raise SpecError("backend.server_log", "read by one client process: set load.workers 1")
    hardware = spec.backend.hardware
    if hardware is not None and hardware != "measured" and datasheet(hardware) is None:
        known = ", ".join(HARDWARE)
        raise SpecError("backend.hardware", f"unknown '{hardware}'; use measured or one of {known}")
    _check_weights(spec)
    if not 0 <= spec.max_failed_fraction <= 1:
        raise SpecError(
            "max_failed_fraction", f"must be between 0 and 1, got {spec.max_failed_fraction}"
        )
    for key, limit in spec.slo.items():
        if key not in SLO_METRICS:
            raise SpecError(f"slo.{key}", f"unknown SLO; use {', '.join(SLO_METRICS)}")
        if limit <= 0:
            raise SpecError(f"slo.{key}", f"must be > 0, got {limit}")


def _check_headers(backend: BackendSpec) -> None:
    """Header names are HTTP tokens and values one line: else every request would fail."""
    names = {f"backend.headers.{name}": name for name in backend.headers}
    if backend.request_id_header is not None:
        names["backend.request_id_header"] = backend.request_id_header
    for path, name in names.items():
        if not name or not set(name) <= _HEADER_NAME_CHARS:
            raise SpecError(path, f"not an HTTP header name: {name!r}")
    for name, value in backend.headers.items():
        if "\r" in value or "\n" in value:
            raise SpecError(f"backend.headers.{name}", "a header value must be one line")


_HEADER_NAME_CHARS = set(string.ascii_letters + string.digits + "!#$%&'*+-.^_`|~")  # RFC 9110


def _check_weights(spec: RunSpec) -> None:
    """`backend.weights` / `backend.weights_bytes_per_param`: at most one, for an openai server
    (the built-in engine knows its own weights), a known storage name or a size > 0."""
    b = spec.backend
    values = {"weights": b.weights, "weights_bytes_per_param": b.weights_bytes_per_param}
    given = [name for name, value in values.items() if value is not None]
    if not given:
        return
    if b.kind != "openai":
        reason = "only for backend kind 'openai' (the engine's weights are `dtype`)"
        raise SpecError(f"backend.{given[0]}", reason)
    if len(given) > 1:
        raise SpecError("backend.weights_bytes_per_param", "give backend.weights or this, not both")
    if b.weights is not None and b.weights not in BYTES_PER_ELEM:
        known = ", ".join(BYTES_PER_ELEM)
        raise SpecError("backend.weights", f"unknown '{b.weights}'; use one of {known}")
    if b.weights_bytes_per_param is not None and b.weights_bytes_per_param <= 0:
        raise SpecError(
            "backend.weights_bytes_per_param", f"must be > 0, got {b.weights_bytes_per_param}"
        )


def _check_speculative(spec: RunSpec) -> None:
    s = spec.engine.speculative
    if s.num_tokens < 1:
        raise SpecError("engine.speculative.num_tokens", f"must be >= 1, got {s.num_tokens}")
    if not 1 <= s.ngram_min <= s.ngram_max:
        raise SpecError(
            "engine.speculative.ngram_min",
            f"need 1 <= ngram_min <= ngram_max, got {s.ngram_min} and {s.ngram_max}",
        )
    if s.method == "draft" and not s.draft_model:
        raise SpecError("engine.speculative.draft_model", "required for method 'draft'")
    if s.method != "none" and spec.backend.kind != "engine":
        raise SpecError(
            "engine.speculative.method", "only for backend kind 'engine' (a server has its own)"
        )


def _check_quantize(quantize: str | None) -> None:
    """`engine.quantize`: a scheme the engine reads (`int8`, `int4:64`, `int4:sym`, ...) or
    none."""
    from llmbench.engine.quant.scheme import parse_quantize  # torch-free: checked before loading

    try:
        parse_quantize(quantize)
    except UserError as e:
        raise SpecError("engine.quantize", str(e)) from None


def _check_moe_offload(spec: RunSpec) -> None:
    """`engine.moe_offload`: counts >= 0, a link the hardware table or a bandwidth names."""
    o = spec.engine.moe_offload
    if o is None:
        return
    if spec.backend.kind != "engine":
        raise SpecError("engine.moe_offload", "only for backend kind 'engine'")
    for name in ("resident", "cache"):
        if getattr(o, name) < 0:
            raise SpecError(f"engine.moe_offload.{name}", f"must be >= 0, got {getattr(o, name)}")
    try:
        if o.link not in (None, "real"):  # real: the machine's own link, no simulated bandwidth
            link_bandwidth(o.link)
    except UserError as e:
        raise SpecError("engine.moe_offload.link", str(e)) from None
    if o.sleep and o.link == "real":
        raise SpecError("engine.moe_offload.sleep", "only for a simulated link")


def _check_quality(spec: RunSpec) -> None:
    q = spec.quality
    if spec.backend.kind != "engine":
        raise SpecError("quality", "only for backend kind 'engine' (it scores the engine itself)")
    for name in ("tokens", "context"):
        if getattr(q, name) < 2:
            raise SpecError(f"quality.{name}", f"must be >= 2, got {getattr(q, name)}")
    if q.generate < 0:
        raise SpecError("quality.generate", f"must be >= 0, got {q.generate}")


def _check_workload(w: WorkloadSpec) -> None:
    if w.sessions <= 0:
        raise SpecError("workload.sessions", f"must be > 0, got {w.sessions}")
    if w.system_prompt_tokens < 0:
        raise SpecError(
            "workload.system_prompt_tokens", f"must be >= 0, got {w.system_prompt_tokens}"
        )
    for f in dataclasses.fields(w):
        value = getattr(w, f.name)
        if isinstance(value, Dist):
            value.check(f"workload.{f.name}")
    if isinstance(w, RagWorkload):
        for name in ("num_documents", "docs_per_query", "zipf_s"):
            if getattr(w, name) <= 0:
                raise SpecError(f"workload.{name}", f"must be > 0, got {getattr(w, name)}")
        if w.docs_per_query > w.num_documents:
            raise SpecError(
                "workload.docs_per_query", f"must be <= num_documents ({w.num_documents})"
            )
    if isinstance(w, AgenticWorkload) and w.tool_schema_tokens < 0:
        raise SpecError("workload.tool_schema_tokens", f"must be >= 0, got {w.tool_schema_tokens}")


def _check_load(load: LoadSpec) -> None:
    if isinstance(load, ConcurrencyLoad) and load.concurrency <= 0:
        raise SpecError("load.concurrency", f"must be > 0, got {load.concurrency}")
    if isinstance(load, (RateLoad, GammaLoad)):
        if load.rate_per_s is None and not load.sweep:
            raise SpecError("load.rate_per_s", f"required for load kind '{load.kind}'")
        if load.rate_per_s is not None and load.rate_per_s <= 0:
            raise SpecError("load.rate_per_s", f"must be > 0, got {load.rate_per_s}")
    if isinstance(load, GammaLoad) and load.burstiness <= 0:
        raise SpecError("load.burstiness", f"must be > 0, got {load.burstiness}")
    if isinstance(load, TraceLoad) and not load.trace:
        raise SpecError("load.trace", "required for load kind 'trace'")
    if load.sweep is not None and (not load.sweep or any(v <= 0 for v in load.sweep)):
        raise SpecError("load.sweep", "must be a non-empty list of values > 0")
