"""The one translation from a spec's engine settings (or a command's flags) to `EngineConfig`."""

from __future__ import annotations

import pytest

from llmbench.engine.engine import EngineConfig
from llmbench.engine.kv_dtype import KVCacheDtype
from llmbench.engine.speculative import SpeculativeConfig
from llmbench.errors import UserError
from llmbench.harness.engine_config import engine_config, engine_spec_of_flags, moe_offload_config
from llmbench.harness.spec import EngineSpec, KVCacheDtypeSpec, MoEOffloadSpec, SpeculativeSpec
from llmbench.harness.spec_load import load_spec


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
