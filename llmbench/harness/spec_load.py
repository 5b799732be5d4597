"""A workload YAML (or a results file's spec) → a checked `RunSpec`.

The YAML is read with the line of every key (`yaml_source`), `--set key.path=value` overrides
are applied, the data is converted strictly (`plain_data`) and checked for values that are
well-typed but impossible (`load.rate_per_s: must be > 0`); every mistake is one line with the
file, the key path and the line: `workloads/x.yaml:12: load.rate_per_s: must be > 0, got -1`, or
the `--set` that made it: `--set load.rate_per_s=-1: load.rate_per_s: must be > 0, got -1.0`.

A `--set` of a section's kind (`load.kind=concurrency` over a poisson load) drops the keys of
the section the new kind has no field for, with a note on stderr naming them; a YAML that mixes
the keys of two kinds is still an error.

What a spec expands to is bounded before anything is built (`_check_limits`: sessions, turns,
tokens, documents, delays, repetitions, sweep points, the text of the whole workload), each
refused with the limit named: `workload.sessions: at most 100,000 (a limit of llmbench), got
10,000,000`; so is YAML that is more than plain data (an alias bomb, `yaml_source`).
"""

from __future__ import annotations

import dataclasses
import math
import string
import sys
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from llmbench.errors import UserError
from llmbench.harness import shards, workloads
from llmbench.harness.arrivals import MAX_SWEEP_POINTS
from llmbench.harness.metrics import SLO_METRICS
from llmbench.harness.plain_data import from_plain
from llmbench.harness.prices import load_prices
from llmbench.harness.spec import (
    AgenticWorkload,
    BackendSpec,
    ConcurrencyLoad,
    Dist,
    GammaLoad,
    LoadSpec,
    RagWorkload,
    RateLoad,
    RunSpec,
    TraceLoad,
    WorkloadSpec,
)
from llmbench.harness.yaml_source import MAX_BYTES, SpecError, check_plain, located, read_yaml
from llmbench.roofline.cost_model import BYTES_PER_ELEM
from llmbench.roofline.datasheets import HARDWARE, datasheet, link_bandwidth


def print_note(line: str) -> None:
    """A note of the spec's loading (`note: --set load.kind=... drops ...`), on stderr."""
    print(line, file=sys.stderr, flush=True)


def load_spec(
    path: Path, overrides: Sequence[str] = (), say: Callable[[str], None] = print_note
) -> RunSpec:
    """Read a workload YAML, apply `key.path=value` overrides, and check everything; `say`
    gets the notes of the overrides (a kind switched, keys dropped)."""
    source = read_spec_data(path, overrides, say)
    try:
        return build_spec(source.data)
    except SpecError as e:
        raise source.error(e) from None


@dataclass(frozen=True)
class SpecData:
    """A workload YAML as plain data with its `--set` overrides set (not yet checked): the
    file, the line of every key path it holds, and each key an override set, with the option
    as typed (`--set load.rate_per_s=-1`), the last one set last."""

    path: Path
    data: dict[str, Any]
    lines: dict[str, int]
    sets: dict[str, str]

    def error(self, e: SpecError) -> UserError:
        """`e` as the one line a person reads: `--set KEY=VALUE: key.path: reason` when an
        override made it, `file:line: key.path: reason` when the file did."""
        key = self._set_by(e.path)
        if key is None:
            return located(e, str(self.path), self.lines)
        option = self.sets[key]
        return UserError(f"{option}: {e.path}: {e.reason}{_list_hint(key, option, e)}")

    def _set_by(self, path: str) -> str | None:
        """The override a mistake at `path` comes from: the one that set `path` (or a key
        under it, or the section on its way), else, for a key the file does not hold (a
        required one, a default made impossible), the one that set its section's `kind`."""
        keys = list(reversed(self.sets))
        key = owner(path, keys)
        if key is None and path not in self.lines:
            kinds = [k for k in keys if k.endswith(".kind")]
            key = next((k for k in kinds if path.startswith(k.removesuffix("kind"))), None)
        return key


def _list_hint(key: str, option: str, e: SpecError) -> str:
    """What to type when a `--set` value meant as a list was read as one value: YAML reads
    `load.sweep=1,2` as the string "1,2"."""
    raw = option.partition("=")[2].strip()
    if e.path != key or not e.reason.startswith("must be a list") or raw.startswith("["):
        return ""
    return f"; write {key}=[{raw}]"


def read_spec_data(
    path: Path, overrides: Sequence[str] = (), say: Callable[[str], None] = print_note
) -> SpecData:
    """A workload YAML as plain data with the `key.path=value` overrides set, in order (not yet
    checked); `say` gets a note for each override that switches a kind and drops keys."""
    try:
        if path.stat().st_size > MAX_BYTES:  # not read at all: a spec is a few KB
            raise UserError(
                f"{path}: {path.stat().st_size:,} bytes, over the {MAX_BYTES:,} llmbench reads "
                "of a spec; give a workload YAML"
            )
        text = path.read_text()
    except OSError as e:
        raise UserError(f"{path}: cannot read ({e.strerror}); give a workload YAML") from None
    data, lines = read_yaml(text, str(path))
    data = {} if data is None else data
    if not isinstance(data, dict):
        raise UserError(f"{path}: the top level must be a mapping of keys")
    sets: dict[str, str] = {}
    for override in overrides:
        key, raw = split_override(override, "--set")
        option = f"--set {override}"
        try:
            switch = set_override(data, key, override_value(raw, option))
        except SpecError as e:
            raise UserError(f"{option}: {e.path}: {e.reason}") from None
        sets.pop(key, None)  # the last --set of a key is the one that holds
        sets[key] = option
        if switch is not None:
            say(f"note: {option} {switch.text}")
            for dropped in switch.dropped:  # gone: no mistake can be there any more
                lines.pop(dropped, None)
                sets.pop(dropped, None)
    return SpecData(path, data, lines, sets)


def split_override(text: str, option: str, form: str = "key.path=value") -> tuple[str, str]:
    """`key.path=value` as typed after `option` (`--set`, `--vary`): the key and the raw value."""
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise UserError(f"{option} {text}: expected {form}")
    return key.strip(), raw


def override_value(raw: str, where: str) -> Any:
    """An override's value read as YAML (`8`, `true`, `int4:64`, `{k: int8, v: int4}`); nothing:
    null. Malformed YAML, or more than plain data (an alias), is one line naming `where`."""
    check_plain(raw, where, has_lines=False)
    try:
        return yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError as e:
        raise UserError(f"{where}: not a YAML value ({getattr(e, 'problem', e)})") from None


def owner(path: str, keys: Sequence[str]) -> str | None:
    """The first of the set `keys` a mistake at `path` belongs to: the key itself, a key under
    it (`engine.speculative` → `engine.speculative.method`), or a section on its way (an
    unknown `enigne` of `enigne.quantize`)."""
    for key in keys:
        if path == key or path.startswith((f"{key}.", f"{key}[")) or key.startswith(f"{path}."):
            return key
    return None


def build_spec(data: dict[str, Any]) -> RunSpec:
    """Spec data (a YAML read, overrides set) as a checked `RunSpec`; a problem is a
    `SpecError` naming its key path."""
    spec = from_plain(RunSpec, data)
    _check(spec)
    return spec


def spec_from_dict(data: dict[str, Any], where: str) -> RunSpec:
    """A spec as `RunSpec.to_dict` gave it (a results file's `spec`, a worker's), checked as a
    YAML is; a problem is one line naming `where` and the key."""
    try:
        spec = from_plain(RunSpec, data)
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


# The sections whose dataclass their `kind` chooses (`plain_data` builds them by kind).
KIND_SECTIONS: dict[str, Any] = {"load": LoadSpec, "workload": WorkloadSpec}


@dataclass(frozen=True)
class KindSwitch:
    """An override that switched `section`'s kind from `old`, dropping the `dropped` key paths
    (the old kind's keys the new one has no field for)."""

    section: str
    old: str
    dropped: tuple[str, ...]

    @property
    def text(self) -> str:
        """`drops load.rate_per_s (a field of poisson loads)`."""
        what = "a field" if len(self.dropped) == 1 else "fields"
        return f"drops {', '.join(self.dropped)} ({what} of {self.old} {self.section}s)"


def set_override(data: dict, key: str, value: Any) -> KindSwitch | None:
    """Set dotted `key` in spec data as `set_path` does; setting a section's kind to another
    kind (`load.kind`, `workload.kind`) also drops the section's keys the new kind has no field
    for: what it dropped, or None."""
    section, _, name = key.rpartition(".")
    node = data.get(section) if name == "kind" and section in KIND_SECTIONS else None
    if not isinstance(node, dict):
        set_path(data, key, value)
        return None
    fields = _fields_by_kind(KIND_SECTIONS[section])
    old = node.get("kind", next(iter(fields)))  # no kind written: the first, as plain_data does
    node["kind"] = value
    if not (isinstance(old, str) and isinstance(value, str)):
        return None  # not a kind at all: its error comes when the spec is built
    if old == value or old not in fields or value not in fields:
        return None  # the same kind, or an unknown one (its error comes when the spec is built)
    dropped = [k for k in node if k not in fields[value]]
    for k in dropped:
        del node[k]
    return KindSwitch(section, old, tuple(f"{section}.{k}" for k in dropped)) if dropped else None


def _fields_by_kind(union: Any) -> dict[str, set[str]]:
    """kind → the field names of its dataclass, for a union told apart by `kind`."""
    return {
        kind: {f.name for f in dataclasses.fields(cls)}
        for cls in typing.get_args(union)
        for kind in typing.get_args(typing.get_type_hints(cls)["kind"])
    }


def _check(spec: RunSpec) -> None:
    """Values that are well-typed but impossible, or beyond what llmbench expands."""
    _check_workload(spec.workload)
    _check_load(spec.load)
    if spec.load.search is not None and not spec.slo:
        raise SpecError("load.search", "searches for the highest load that meets slo.*; set one")
    sessions = spec.workload.sessions
    if spec.load.kind == "concurrency" and spec.load.search and spec.load.search.high > sessions:
        raise SpecError(
            "load.search.high",
            f"concurrency {spec.load.search.high:g} is past workload.sessions ({sessions}): a "
            "closed loop never has more in flight; raise workload.sessions",
        )
    _check_limits(spec)
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
    if eng.kv_cache_memory is not None and not eng.kv_cache_memory > 0:
        raise SpecError("engine.kv_cache_memory", f"must be > 0, got {eng.kv_cache_memory}")
    if eng.threads is not None and eng.threads < 1:
        raise SpecError("engine.threads", f"must be >= 1, got {eng.threads}")
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
    _check_addresses(spec)
    if spec.gpu_hour_price is not None and not spec.gpu_hour_price > 0:
        raise SpecError("gpu_hour_price", f"must be > 0, got {spec.gpu_hour_price}")
    if spec.prices is not None:
        try:
            load_prices(spec.prices)
        except UserError as e:
            raise SpecError("prices", str(e)) from None
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


MAX_REPEAT = 100  # repetitions of the measured phase: each builds its own workload

# The limit of each workload distribution that is no token count (`workloads.MAX_TOKENS`).
_DIST_LIMITS = {
    "turns": workloads.MAX_TURNS,
    "tool_steps": workloads.MAX_TURNS,
    "think_time_s": workloads.MAX_DELAY_S,
    "tool_latency_s": workloads.MAX_DELAY_S,
}


def _check_limits(spec: RunSpec) -> None:
    """What the spec expands to, within llmbench's limits (`workloads.MAX_*`, `MAX_REPEAT`,
    `arrivals.MAX_SWEEP_POINTS`): far past a real benchmark, but a bound on the memory and the
    time of building the workload before the first request. A distribution is checked by the
    largest value it draws (`workloads.upper_bound`; a normal or lognormal without a `max` by
    its mean, and a draw beyond the limit is clipped to it)."""
    w = spec.workload
    limits = {
        "workload.sessions": (w.sessions, workloads.MAX_SESSIONS),
        "warmup_requests": (spec.warmup_requests, workloads.MAX_SESSIONS),
        "repeat": (spec.repeat, MAX_REPEAT),
        "workload.system_prompt_tokens": (w.system_prompt_tokens, workloads.MAX_TOKENS),
        "load.sweep": (len(spec.load.sweep or ()), MAX_SWEEP_POINTS),
    }
    if isinstance(w, RagWorkload):
        limits["workload.num_documents"] = (w.num_documents, workloads.MAX_DOCUMENTS)
        limits["workload.zipf_s"] = (w.zipf_s, workloads.MAX_ZIPF_S)
    if isinstance(w, AgenticWorkload):
        limits["workload.tool_schema_tokens"] = (w.tool_schema_tokens, workloads.MAX_TOKENS)
    if spec.quality is not None:
        for name in ("tokens", "context", "generate"):
            limits[f"quality.{name}"] = (getattr(spec.quality, name), workloads.MAX_TOKENS)
    for f in dataclasses.fields(w):
        value = getattr(w, f.name)
        if isinstance(value, Dist):
            limit = _DIST_LIMITS.get(f.name, workloads.MAX_TOKENS)
            limits[f"workload.{f.name}"] = (workloads.upper_bound(value), limit)
    for path, (value, limit) in limits.items():
        if not value <= limit:  # NaN too
            unit = " points" if path == "load.sweep" else ""
            reason = f"at most {_number(limit)}{unit} (a limit of llmbench), got {_number(value)}"
            raise SpecError(path, reason)
    copies = spec.repeat * w.sessions + spec.warmup_requests
    if isinstance(w, RagWorkload):
        draws = workloads.document_draws(w)
        if copies * draws * w.num_documents > workloads.MAX_DOCUMENT_SCANS:
            raise SpecError(
                "workload.docs_per_query",
                f"{w.docs_per_query} distinct documents of {w.num_documents} under zipf_s "
                f"{w.zipf_s:g} take about {draws:,.0f} draws a query, each over every document: "
                f"for {copies:,} queries, over the {workloads.MAX_DOCUMENT_SCANS:,} of llmbench's "
                "limit; lower docs_per_query or zipf_s, or raise num_documents",
            )
    total = workloads.workload_tokens(w, copies)
    if total > workloads.MAX_WORKLOAD_TOKENS:
        raise SpecError(
            "workload.sessions",
            f"the workload makes up to {total:,} tokens of text ({copies:,} sessions, warm-up and "
            f"every repetition included), over the {workloads.MAX_WORKLOAD_TOKENS:,} of "
            "llmbench's limit; use fewer sessions or shorter texts",
        )


def _number(value: float) -> str:
    """`10,000,000`, `0.5`: a limit or a value in a limit's line."""
    return f"{int(value):,}" if float(value).is_integer() else f"{value:,g}"


def _check_addresses(spec: RunSpec) -> None:
    """One server (`backend.url`) or several (`backend.urls`, routed), for the openai backend
    only; the routing's numbers in range."""
    backend = spec.backend
    if backend.url and backend.urls:
        raise SpecError("backend.urls", "give backend.url (one server) or backend.urls, not both")
    if backend.urls and backend.kind != "openai":
        raise SpecError("backend.urls", "only for backend kind 'openai'")
    if backend.kind == "openai" and not backend.addresses:
        raise SpecError("backend.url", "required for backend kind 'openai' (or backend.urls)")
    if len(set(backend.urls)) != len(backend.urls):
        raise SpecError("backend.urls", "lists an address twice")
    if spec.load.workers > 1 and backend.urls:
        raise SpecError("backend.urls", "routed by one client process: set load.workers 1")
    if backend.reset_prefix_cache and backend.kind == "transformers":
        raise SpecError("backend.reset_prefix_cache", "the transformers backend has no cache")
    if backend.reset_prefix_cache and spec.load.workers > 1:
        raise SpecError(
            "backend.reset_prefix_cache",
            "one client process resets the caches: set load.workers 1",
        )
    routing = spec.routing
    if routing.block_tokens < 1:
        raise SpecError("routing.block_tokens", f"must be >= 1, got {routing.block_tokens}")
    if routing.max_imbalance < 1:
        raise SpecError("routing.max_imbalance", f"must be >= 1, got {routing.max_imbalance}")
    if not 0 <= routing.min_match <= 1:
        raise SpecError("routing.min_match", f"must be between 0 and 1, got {routing.min_match}")
    if routing.down_s < 0:
        raise SpecError("routing.down_s", f"must be >= 0, got {routing.down_s}")


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
        if load.rate_per_s is None and not load.sweep and load.search is None:
            raise SpecError("load.rate_per_s", f"required for load kind '{load.kind}'")
        if load.rate_per_s is not None and load.rate_per_s <= 0:
            raise SpecError("load.rate_per_s", f"must be > 0, got {load.rate_per_s}")
    if isinstance(load, GammaLoad) and load.burstiness <= 0:
        raise SpecError("load.burstiness", f"must be > 0, got {load.burstiness}")
    if isinstance(load, TraceLoad) and not load.trace:
        raise SpecError("load.trace", "required for load kind 'trace'")
    if load.sweep is not None and (not load.sweep or any(v <= 0 for v in load.sweep)):
        raise SpecError("load.sweep", "must be a non-empty list of values > 0")
    if load.search is not None:
        _check_search(load)


def _check_search(load: LoadSpec) -> None:
    search = load.search
    if load.sweep:
        raise SpecError("load.search", "not with load.sweep: give the loads or a range to search")
    if not (0 < search.low < search.high and math.isfinite(search.high)):
        raise SpecError(
            "load.search", f"needs 0 < low < high, got low {search.low}, high {search.high}"
        )
    if isinstance(load, ConcurrencyLoad) and not (
        float(search.low).is_integer() and float(search.high).is_integer()
    ):
        raise SpecError("load.search", "low and high are concurrencies: whole numbers")
    if not 2 <= search.points <= MAX_SWEEP_POINTS:
        raise SpecError(
            "load.search.points", f"must be 2 .. {MAX_SWEEP_POINTS}, got {search.points}"
        )
