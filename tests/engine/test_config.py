"""ModelConfig's MoE fields: parameter counts by hand and against published totals, and the
checks that refuse an inconsistent config in one line."""

from __future__ import annotations

import dataclasses

import pytest

from llmbench.engine.config import ModelConfig
from llmbench.engine.presets import PRESETS
from llmbench.errors import UserError


def test_tiny_moe_parameters_by_hand():
    # vocab 512, h 64, 2 layers, q 4×16, kv 2×16, 8 experts of 32 (top 2), shared expert 64,
    # q/k norm, tied embeddings.
    attn = 64 * (64 + 2 * 32) + 64 * 64 + 2 * 16  # q/k/v, o, q_norm + k_norm
    router, expert, shared = 64 * 8, 3 * 64 * 32, 3 * 64 * 64 + 64  # shared + its gate [1, h]
    norms = 2 * 64
    embed_and_final_norm = 512 * 64 + 64
    config = PRESETS["tiny-moe"]
    assert config.is_moe
    assert config.num_params() == embed_and_final_norm + 2 * (
        attn + router + 8 * expert + shared + norms
    )
    assert config.num_active_params() == embed_and_final_norm + 2 * (
        attn + router + 2 * expert + shared + norms
    )


@pytest.mark.parametrize(
    "preset, total_b, active_b",
    [("mixtral-8x7b", 46.7, 12.9), ("qwen3-30b-a3b", 30.5, 3.3), ("olmoe-1b-7b", 6.9, 1.3)],
)
def test_moe_presets_match_the_published_totals(preset, total_b, active_b):
    """The model cards' totals ("46.7B total, 12.9B active" for Mixtral, ...), as rounded there
    (Qwen3-30B-A3B's 3.35 billion active parameters are "3.3B" on its card)."""
    config = PRESETS[preset]
    assert abs(config.num_params() / 1e9 - total_b) < 0.06
    assert abs(config.num_active_params() / 1e9 - active_b) < 0.06


def test_dense_models_have_every_parameter_active():
    config = PRESETS["smollm2-135m"]
    assert not config.is_moe
    assert config.num_active_params() == config.num_params() == 134_515_008


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(num_experts_per_tok=0), "num_experts_per_tok must be in 1..8"),
        (dict(num_experts_per_tok=9), "num_experts_per_tok must be in 1..8"),
        (dict(moe_intermediate_size=0), "moe_intermediate_size > 0"),
        (dict(router_scoring="relu"), "router_scoring must be softmax or sigmoid"),
        (dict(num_experts=0), "need num_experts > 0"),
        (dict(num_experts=-1), "num_experts must be >= 0"),
    ],
)
def test_inconsistent_moe_configs_are_refused(change, message):
    with pytest.raises(UserError, match=message):
        dataclasses.replace(PRESETS["tiny-moe"], **change)


def test_a_shared_expert_needs_experts():
    with pytest.raises(UserError, match="shared expert needs num_experts > 0"):
        dataclasses.replace(PRESETS["tiny"], shared_expert_intermediate_size=8)


def test_defaults_are_dense():
    config = ModelConfig(
        vocab_size=8,
        hidden_size=8,
        num_layers=1,
        num_heads=1,
        num_kv_heads=1,
        head_dim=8,
        intermediate_size=8,
        max_position_embeddings=8,
    )
    assert not config.is_moe and not config.qk_norm
    assert (config.num_experts, config.num_experts_per_tok, config.moe_intermediate_size) == (
        0,
        0,
        0,
    )
    assert config.router_scoring == "softmax" and config.norm_topk_prob
