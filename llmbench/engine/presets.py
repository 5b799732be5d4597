"""Shapes of real models, so any size can be benchmarked (`synthetic:<name>`) or costed offline.

Numbers are copied from each model's published `config.json`. `<name>?layers=N` keeps the first
N layers of a preset (every per-layer shape unchanged), so a 48-layer MoE fits a small machine.
"""

from __future__ import annotations

import dataclasses

from llmbench.engine.config import ModelConfig, RopeScaling
from llmbench.errors import UserError

_LLAMA31_ROPE = RopeScaling(
    factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=8192
)
_LLAMA32_ROPE = RopeScaling(
    factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=8192
)

PRESETS: dict[str, ModelConfig] = {
    # A toy for tests and smoke runs: every code path, milliseconds per step.
    "tiny": ModelConfig(
        vocab_size=512,
        hidden_size=64,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        intermediate_size=128,
        max_position_embeddings=4096,
        rope_theta=10000.0,
        tie_word_embeddings=True,
    ),
    "smollm2-135m": ModelConfig(
        vocab_size=49152,
        hidden_size=576,
        num_layers=30,
        num_heads=9,
        num_kv_heads=3,
        head_dim=64,
        intermediate_size=1536,
        max_position_embeddings=8192,
        rope_theta=100000.0,
        tie_word_embeddings=True,
    ),
    "llama-3.2-1b": ModelConfig(
        vocab_size=128256,
        hidden_size=2048,
        num_layers=16,
        num_heads=32,
        num_kv_heads=8,
        head_dim=64,
        intermediate_size=8192,
        max_position_embeddings=131072,
        rope_theta=500000.0,
        rope_scaling=_LLAMA32_ROPE,
        tie_word_embeddings=True,
    ),
    "llama-3.1-8b": ModelConfig(
        vocab_size=128256,
        hidden_size=4096,
        num_layers=32,
        num_heads=32,
        num_kv_heads=8,
        head_dim=128,
        intermediate_size=14336,
        max_position_embeddings=131072,
        rope_theta=500000.0,
        rope_scaling=_LLAMA31_ROPE,
    ),
    "qwen2.5-7b": ModelConfig(
        vocab_size=152064,
        hidden_size=3584,
        num_layers=28,
        num_heads=28,
        num_kv_heads=4,
        head_dim=128,
        intermediate_size=18944,
        max_position_embeddings=32768,
        rope_theta=1000000.0,
        rms_norm_eps=1e-6,
        qkv_bias=True,
    ),
    "llama-3.1-70b": ModelConfig(
        vocab_size=128256,
        hidden_size=8192,
        num_layers=80,
        num_heads=64,
        num_kv_heads=8,
        head_dim=128,
        intermediate_size=28672,
        max_position_embeddings=131072,
        rope_theta=500000.0,
        rope_scaling=_LLAMA31_ROPE,
    ),
    # A toy mixture of experts for tests and smoke runs: 8 experts, top-2, a gated shared expert
    # and Qwen3's q/k norm, so every MoE code path runs in milliseconds.
    "tiny-moe": ModelConfig(
        vocab_size=512,
        hidden_size=64,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        intermediate_size=32,
        max_position_embeddings=4096,
        rope_theta=10000.0,
        tie_word_embeddings=True,
        num_experts=8,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        shared_expert_intermediate_size=64,
        qk_norm=True,
    ),
    # OLMoE's q/k RMSNorm spans all heads at once ([h] weights), which the engine does not
    # model; left out, it is 2·h parameters per layer of 1e8.
    "olmoe-1b-7b": ModelConfig(
        vocab_size=50304,
        hidden_size=2048,
        num_layers=16,
        num_heads=16,
        num_kv_heads=16,
        head_dim=128,
        intermediate_size=1024,
        max_position_embeddings=4096,
        rope_theta=10000.0,
        num_experts=64,
        num_experts_per_tok=8,
        moe_intermediate_size=1024,
        norm_topk_prob=False,
    ),
    "qwen3-30b-a3b": ModelConfig(
        vocab_size=151936,
        hidden_size=2048,
        num_layers=48,
        num_heads=32,
        num_kv_heads=4,
        head_dim=128,
        intermediate_size=6144,
        max_position_embeddings=40960,
        rope_theta=1000000.0,
        rms_norm_eps=1e-6,
        num_experts=128,
        num_experts_per_tok=8,
        moe_intermediate_size=768,
        norm_topk_prob=True,
        qk_norm=True,
    ),
    "mixtral-8x7b": ModelConfig(
        vocab_size=32000,
        hidden_size=4096,
        num_layers=32,
        num_heads=32,
        num_kv_heads=8,
        head_dim=128,
        intermediate_size=14336,
        max_position_embeddings=32768,
        rope_theta=1000000.0,
        num_experts=8,
        num_experts_per_tok=2,
        moe_intermediate_size=14336,
        norm_topk_prob=True,
    ),
}


def preset_config(spec: str) -> ModelConfig:
    """The config a preset spec names: `<name>` or `<name>?layers=N` (first N layers only)."""
    name, _, options = spec.partition("?")
    if name not in PRESETS:
        raise UserError(f"synthetic:{name}: unknown preset; choose one of {', '.join(PRESETS)}")
    config = PRESETS[name]
    if not options:
        return config
    key, _, value = options.partition("=")
    if key != "layers":
        raise UserError(
            f"synthetic:{spec}: unknown option {options!r}; the one option is ?layers=N"
        )
    if not value.isdigit() or int(value) < 1:
        raise UserError(f"synthetic:{spec}: layers must be a whole number >= 1, got {value!r}")
    return dataclasses.replace(config, num_layers=int(value))
