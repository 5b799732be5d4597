"""The one translation from a spec's engine settings (or a command's flags) to `EngineConfig`."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmbench.engine.engine import EngineConfig, KVCacheDemand
from llmbench.engine.kv_dtype import KVCacheDtype
from llmbench.engine.speculative import SpeculativeConfig
from llmbench.errors import UserError
from llmbench.harness.engine_config import (
    engine_config,
    engine_spec_of_flags,
    kv_cache_demand,
    moe_offload_config,
    parse_moe_offload,
)
from llmbench.harness.spec import EngineSpec, KVCacheDtypeSpec, MoEOffloadSpec, SpeculativeSpec
from llmbench.harness.spec_load import load_spec
from llmbench.harness.workloads import longest_context_tokens

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_every_field_of_the_engine_block_reaches_the_engine():
    spec = EngineSpec(
        block_size=32,
        max_num_batched_tokens=512,
        max_num_seqs=8,
        prefix_caching=False,
        kv_cache_memory=2**28,
        threads=1,
        kv_cache_dtype=KVCacheDtypeSpec(k="bfloat16", v="int8"),
        speculative=SpeculativeSpec("draft", 3, draft_model="self:layers=2"),
        quantize="int4:32",
    )
    config = engine_config("synthetic:tiny", "bfloat16", "cpu", spec)
    assert config == EngineConfig(
        model="synthetic:tiny",
        dtype="bfloat16",
        device="cpu",
        block_size=32,
        kv_cache_memory=2**28,
        max_num_batched_tokens=512,
        max_num_seqs=8,
        enable_prefix_caching=False,
        num_threads=1,
        kv_cache_dtype=KVCacheDtype("bfloat16", "int8"),
        speculative=SpeculativeConfig("draft", 3, draft_model="self:layers=2"),
        quantize="int4:32",
        moe_offload=None,
    )


def test_the_default_engine_block_is_the_default_engine():
    assert engine_config("smollm2-135m", "float32", "auto", EngineSpec()) == EngineConfig()


def test_one_kv_format_is_both_sides():
    spec = EngineSpec(kv_cache_dtype="int8")
    assert engine_config("m", "float32", "cpu", spec).kv_cache_dtype == KVCacheDtype("int8", "int8")


def test_a_shipped_workload_gives_the_engine_what_its_yaml_says(tmp_path):
    path = tmp_path / "w.yaml"
    path.write_text(
        "model: synthetic:tiny\ndtype: bfloat16\nengine:\n  max_num_seqs: 4\n"
        "  kv_cache_dtype: {k: auto, v: int4}\n  speculative: {method: ngram, num_tokens: 2}\n"
    )
    spec = load_spec(path)
    config = engine_config(spec.model, spec.dtype, spec.device, spec.engine)
    assert (config.model, config.dtype, config.max_num_seqs) == ("synthetic:tiny", "bfloat16", 4)
    assert config.kv_cache_dtype == KVCacheDtype("auto", "int4")
    assert config.speculative == SpeculativeConfig("ngram", 2)


def test_flags_parse_as_the_spec_keys_do():
    spec = engine_spec_of_flags(
        threads=2,
        kv_cache_memory=None,
        kv_cache_dtype="k=int8,v=int4",
        speculative="draft:synthetic:tiny:5",
        quantize="int8",
        max_num_seqs=1,
    )
    assert spec.kv_cache_dtype == KVCacheDtypeSpec("int8", "int4")
    assert spec.speculative == SpeculativeSpec("draft", 5, draft_model="synthetic:tiny")
    config = engine_config("synthetic:tiny", "float32", "cpu", spec)
    assert (config.num_threads, config.max_num_seqs, config.quantize) == (2, 1, "int8")
    with pytest.raises(UserError, match="--speculative"):
        engine_spec_of_flags(
            threads=None,
            kv_cache_memory=None,
            kv_cache_dtype="auto",
            speculative="x",
            quantize=None,
        )


def test_the_engine_config_on_a_cpu_simulates_pcie4_by_default():
    config = moe_offload_config(MoEOffloadSpec(resident=4, cache=1), "cpu")
    assert (config.num_resident, config.num_cached) == (4, 1)
    assert config.link_bytes_per_s == 32e9 and config.is_simulated and not config.sleep
    assert moe_offload_config(MoEOffloadSpec(4, link="25GB/s", sleep=True), "cpu").sleep
    real = moe_offload_config(MoEOffloadSpec(resident=4, link="real"), "cpu")
    assert real.link_bytes_per_s is None  # the engine refuses it on a CPU


def test_the_compact_syntax():
    assert parse_moe_offload("none") is None
    assert parse_moe_offload("resident=4") == MoEOffloadSpec(resident=4)
    spec = parse_moe_offload("resident=2,cache=3,link=pcie5,profile=runs/a/experts.json,sleep")
    assert spec == MoEOffloadSpec(2, 3, "pcie5", "runs/a/experts.json", True)


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("cache=2", "resident=N is required"),
        ("resident=4,resident=2", "each key once"),
        ("resident=4,speed=9", "got 'speed=9'"),
        ("resident=-1", "whole number >= 0"),
        ("resident=4,link=pcie9", "link 'pcie9'"),
        ("resident=4,sleep=maybe", "sleep is a flag"),
    ],
)
def test_bad_compact_syntax_is_one_user_error(text, fragment):
    with pytest.raises(UserError, match=fragment):
        parse_moe_offload(text)


def _spec(tmp_path, offload: str, backend: str = "engine"):
    path = tmp_path / "w.yaml"
    url = "\n  url: http://127.0.0.1:1/v1" if backend == "openai" else ""
    path.write_text(
        f"model: synthetic:tiny-moe\nbackend:\n  kind: {backend}{url}\n"
        f"engine:\n  moe_offload: {offload}\n"
    )
    return load_spec(path)


def test_the_spec_reads_and_checks_moe_offload(tmp_path):
    spec = _spec(tmp_path, "{resident: 4, cache: 2, link: pcie3-x16}")
    assert spec.engine.moe_offload == MoEOffloadSpec(4, 2, "pcie3-x16")
    assert _spec(tmp_path, "null").engine.moe_offload is None
    for offload, fragment in [
        ("{resident: -1}", "engine.moe_offload.resident: must be >= 0"),
        ("{resident: 1, link: pcie9}", "engine.moe_offload.link"),
        ("{resident: 1, link: real, sleep: true}", "only for a simulated link"),
        ("{resident: 1, speed: 3}", "unknown key"),
    ]:
        with pytest.raises(UserError, match=fragment):
            _spec(tmp_path, offload)
    with pytest.raises(UserError, match="only for backend kind 'engine'"):
        _spec(tmp_path, "{resident: 1}", backend="openai")


def spec_of(tmp_path, text: str, *sets: str):
    path = tmp_path / "w.yaml"
    path.write_text(text)
    return load_spec(path, list(sets))


def test_the_main_jobs_longest_context_and_kv_demand():
    """workloads/agentic.yaml at its longest: system 400 + schemas 600 + task 120 + 4 steps x
    (result 600 + reply 32) + final 48 = 3,696 tokens, and 11 messages x 16 template tokens
    (system, task, 4 x (reply, result), the final reply): 3,872; 4 sessions in flight."""
    spec = load_spec(REPO_ROOT / "workloads" / "agentic.yaml")
    assert longest_context_tokens(spec.workload) == 3696 + 11 * 16
    assert kv_cache_demand(spec) == KVCacheDemand(num_seqs=4, max_tokens=3872)


def test_longest_context_of_chat_and_rag(tmp_path):
    chat = spec_of(
        tmp_path,
        "workload: {kind: chat, system_prompt_tokens: 100, turns: {dist: uniform, min: 1, "
        "max: 3}, user_tokens: {dist: empirical, values: [10, 50]}, output_tokens: 20}\n",
    )
    # 100 + 3 x (50 + 20) = 310, and 7 messages (system, 3 x (user, reply)).
    assert longest_context_tokens(chat.workload) == 310 + 7 * 16
    rag = spec_of(
        tmp_path,
        "workload: {kind: rag, system_prompt_tokens: 50, docs_per_query: 2, document_tokens: "
        "{dist: normal, mean: 300, std: 50, max: 400}, user_tokens: 30, output_tokens: 40}\n",
    )
    # 50 + 2 x 400 + 30 + 40 = 920, and 5 messages' worth (system, question, reply, 2 docs).
    assert longest_context_tokens(rag.workload) == 920 + 5 * 16
    unbounded = spec_of(
        tmp_path, "workload: {kind: chat, output_tokens: {dist: lognormal, mean: 64, sigma: 1}}\n"
    )
    assert longest_context_tokens(unbounded.workload) is None  # up to the model's window


def test_the_kv_demand_follows_the_load(tmp_path):
    base = "workload: {kind: chat, sessions: 6, turns: 1, user_tokens: 10, output_tokens: 10}\n"
    tokens = 200 + 10 + 10 + 3 * 16  # the default 200-token system prompt
    assert kv_cache_demand(spec_of(tmp_path, base)) == KVCacheDemand(4, tokens)
    sweep = spec_of(tmp_path, base + "load: {kind: concurrency, sweep: [1, 2, 8]}\n")
    assert kv_cache_demand(sweep).num_seqs == 6  # the sweep's 8, but only 6 sessions
    rate = spec_of(tmp_path, base + "load: {kind: poisson, rate_per_s: 2}\n")
    assert kv_cache_demand(rate).num_seqs == 6  # open loop: every session may be in flight
    few = spec_of(tmp_path, base + "engine: {max_num_seqs: 2}\n")
    assert kv_cache_demand(few).num_seqs == 2  # the engine runs 2 at once at most
    ngram = spec_of(tmp_path, base + "engine: {speculative: {method: ngram, num_tokens: 3}}\n")
    assert kv_cache_demand(ngram).max_tokens == tokens + 3


def test_a_runs_engine_gets_the_demand_unless_the_spec_sizes_the_cache(tmp_path):
    spec = load_spec(REPO_ROOT / "workloads" / "agentic.yaml")
    config = engine_config(spec.model, spec.dtype, spec.device, spec.engine, run=spec)
    assert config.kv_cache_demand == KVCacheDemand(4, 3872) and config.kv_cache_memory is None
    told = load_spec(REPO_ROOT / "workloads" / "agentic.yaml", ["engine.kv_cache_memory=100000000"])
    config = engine_config(told.model, told.dtype, told.device, told.engine, run=told)
    assert (config.kv_cache_demand, config.kv_cache_memory) == (None, 1e8)
    assert engine_config(spec.model, spec.dtype, spec.device, spec.engine).kv_cache_demand is None
