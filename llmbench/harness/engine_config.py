"""The one translation from what a user configured to the engine's `EngineConfig`.

A run spec's `model`, `dtype`, `device` and `engine` block — or the same settings given as
command-line flags (`engine_spec_of_flags` and `parse_moe_offload`, for `generate` and
`serve`) — become the frozen `EngineConfig` the engine takes. Studies that size an engine
themselves (`quality`'s exact K/V cache, `profile`'s batch) start from this config and
`dataclasses.replace` what they size. The engine is imported inside the functions: the harness
loads without torch.

A run's engine (`engine_config(..., run=spec)`) with no `engine.kv_cache_memory` gets a K/V cache
sized for its workload (`kv_cache_demand`: the sequences its load keeps in flight × the longest
context its workload can build) instead of 2 GiB whatever the run: the main job's 425 MiB.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from llmbench.errors import UserError
from llmbench.harness.spec import (
    ConcurrencyLoad,
    EngineSpec,
    KVCacheDtypeSpec,
    MoEOffloadSpec,
    RunSpec,
    SpeculativeSpec,
)
from llmbench.harness.workloads import longest_context_tokens
from llmbench.roofline.datasheets import link_bandwidth

if TYPE_CHECKING:  # the engine is imported lazily: `llmbench` runs without torch
    from llmbench.engine.engine import EngineConfig, KVCacheDemand
    from llmbench.engine.kv_dtype import KVCacheDtype
    from llmbench.engine.moe_offload import MoEOffloadConfig

DEFAULT_SIMULATED_LINK = "pcie4-x16"  # a CPU has no device link: one is simulated
REAL_LINK = "real"  # copies over the machine's own link, timed: no simulated bandwidth
_MOE_OFFLOAD_KEYS = ("resident", "cache", "link", "profile", "sleep")


def engine_config(
    model: str, dtype: str, device: str, engine: EngineSpec, run: RunSpec | None = None
) -> EngineConfig:
    """The engine's config for `model` in `dtype` on `device` with the `engine` settings; with
    `run`, the K/V cache is sized for its workload unless `engine.kv_cache_memory` says."""
    from llmbench.engine.engine import EngineConfig
    from llmbench.engine.speculative import SpeculativeConfig

    s = engine.speculative
    offload = engine.moe_offload
    return EngineConfig(
        model=model,
        dtype=dtype,
        device=device,
        block_size=engine.block_size,
        kv_cache_memory=engine.kv_cache_memory,
        kv_cache_demand=kv_cache_demand(run) if run and engine.kv_cache_memory is None else None,
        max_num_batched_tokens=engine.max_num_batched_tokens,
        max_num_seqs=engine.max_num_seqs,
        enable_prefix_caching=engine.prefix_caching,
        num_threads=engine.threads,
        kv_cache_dtype=kv_cache_dtype(engine.kv_cache_dtype),
        quantize=engine.quantize,
        speculative=SpeculativeConfig(
            method=s.method,
            num_tokens=s.num_tokens,
            ngram_min=s.ngram_min,
            ngram_max=s.ngram_max,
            draft_model=s.draft_model,
            adaptive=s.adaptive,
        ),
        moe_offload=None if offload is None else moe_offload_config(offload, device),
        huge_pages=engine.huge_pages,
    )


def kv_cache_demand(spec: RunSpec) -> KVCacheDemand:
    """What the run's workload asks of the engine's K/V cache: its sessions in flight at once
    (a concurrency load's largest concurrency, else every session; never more than the
    sessions or `engine.max_num_seqs`), each up to `longest_context_tokens` (plus the
    speculative tokens a step verifies)."""
    from llmbench.engine.engine import KVCacheDemand

    workload, load = spec.workload, spec.load
    in_flight = workload.sessions
    if isinstance(load, ConcurrencyLoad):
        in_flight = min(in_flight, math.ceil(max((load.concurrency, *(load.sweep or ())))))
    num_seqs = max(1, min(in_flight, spec.engine.max_num_seqs))
    max_tokens = longest_context_tokens(workload)
    if max_tokens is not None and spec.engine.speculative.method != "none":
        max_tokens += spec.engine.speculative.num_tokens
    return KVCacheDemand(num_seqs, max_tokens)


def kv_cache_dtype(value: str | KVCacheDtypeSpec) -> KVCacheDtype:
    """A spec's `engine.kv_cache_dtype` (one format, or keys and values apart) for the engine."""
    from llmbench.engine.kv_dtype import KVCacheDtype

    if isinstance(value, str):
        return KVCacheDtype(value, value)
    return KVCacheDtype(value.k, value.v)


def moe_offload_config(spec: MoEOffloadSpec, device: str) -> MoEOffloadConfig:
    """The engine's offload config; a missing link is pcie4-x16 simulated unless the engine will
    run on CUDA (`device` cuda, or auto with a GPU visible), where the copies are real."""
    from llmbench.engine.engine import resolve_device
    from llmbench.engine.moe_offload import MoEOffloadConfig

    link = spec.link
    if link is None:
        is_cuda = resolve_device(device).type == "cuda"
        link = REAL_LINK if is_cuda else DEFAULT_SIMULATED_LINK
    return MoEOffloadConfig(
        num_resident=spec.resident,
        num_cached=spec.cache,
        link_bytes_per_s=None if link == REAL_LINK else link_bandwidth(link),
        usage_profile=spec.profile,
        sleep=spec.sleep,
    )


def engine_spec_of_flags(
    *,
    threads: int | None,
    kv_cache_memory: float | None,
    kv_cache_dtype: str,
    speculative: str,
    quantize: str | None,
    block_size: int = EngineSpec.block_size,
    max_num_seqs: int = EngineSpec.max_num_seqs,
    prefix_caching: bool = EngineSpec.prefix_caching,
    moe_offload: MoEOffloadSpec | None = None,
) -> EngineSpec:
    """The `engine` block a command's flags describe (`--kv-cache-dtype k=int8,v=int4`,
    `--speculative ngram:4`, ...), parsed with the engine's own parsers so that a flag and a
    spec key accept the same text."""
    from llmbench.engine.kv_dtype import parse_kv_cache_dtype
    from llmbench.engine.speculative import parse_speculative

    kv = parse_kv_cache_dtype(kv_cache_dtype)
    s = parse_speculative(speculative)
    return EngineSpec(
        block_size=block_size,
        max_num_seqs=max_num_seqs,
        prefix_caching=prefix_caching,
        kv_cache_memory=kv_cache_memory,
        threads=threads,
        kv_cache_dtype=KVCacheDtypeSpec(kv.k, kv.v),
        speculative=SpeculativeSpec(
            s.method, s.num_tokens, s.ngram_min, s.ngram_max, s.draft_model, s.adaptive
        ),
        quantize=quantize,
        moe_offload=moe_offload,
    )


def parse_moe_offload(text: str) -> MoEOffloadSpec | None:
    """`--moe-offload` as typed, comma-separated: `resident=N` (experts per layer kept in device
    memory, required), `cache=C` (fetched experts kept per layer, LRU; default 0),
    `link=NAME|NUMBERGB/s|real` (default: pcie4-x16, simulated, on a CPU; real copies on CUDA),
    `profile=PATH` (an experts.json: its most-routed experts stay resident; default the first N
    ids), `sleep` (a simulated link also sleeps each fetch's time so that wall time shows it).
    `resident=4,cache=2,link=pcie4,profile=PATH,sleep` → the spec; `none` → None."""
    if text.strip() in ("", "none"):
        return None
    fields: dict[str, str] = {}
    for part in text.split(","):
        key, sep, value = part.strip().partition("=")
        if key == "sleep" and not sep:
            value, sep = "true", "="
        if not sep or key not in _MOE_OFFLOAD_KEYS or key in fields:
            raise UserError(
                f"--moe-offload {text!r}: expected resident=N[,cache=C][,link=NAME|GB/s|real]"
                f"[,profile=PATH][,sleep], each key once; got {part.strip()!r}"
            )
        fields[key] = value
    if "resident" not in fields:
        raise UserError(f"--moe-offload {text!r}: resident=N is required")
    counts = {}
    for key in ("resident", "cache"):
        value = fields.get(key, "0")
        if not value.isdigit():
            raise UserError(f"--moe-offload: {key} must be a whole number >= 0, got {value!r}")
        counts[key] = int(value)
    if fields.get("sleep", "true") not in ("true", "false"):
        raise UserError(f"--moe-offload: sleep is a flag (sleep, or sleep=true), got {text!r}")
    link = fields.get("link")
    if link not in (None, REAL_LINK):
        link_bandwidth(link)  # a bad name is its UserError
    return MoEOffloadSpec(
        resident=counts["resident"],
        cache=counts["cache"],
        link=link,
        profile=fields.get("profile"),
        sleep=fields.get("sleep") == "true",
    )
