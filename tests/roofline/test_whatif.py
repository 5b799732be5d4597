"""The what-if rows: a Mixtral-shaped MoE decode step by hand, at batch 1 and 64 on an H100."""

from __future__ import annotations

import pytest

from llmbench.engine.config import ModelConfig
from llmbench.engine.presets import PRESETS
from llmbench.roofline.datasheets import HARDWARE
from llmbench.roofline.whatif import whatif_rows

# Mixtral-8x7B's published config.json: 32 layers, h 4096, 32 heads (8 kv) of 128, 8 experts of
# 14,336, top-2, vocab 32,000, untied.
MIXTRAL = ModelConfig(
    vocab_size=32000,
    hidden_size=4096,
    num_layers=32,
    num_heads=32,
    num_kv_heads=8,
    head_dim=128,
    intermediate_size=14336,
    max_position_embeddings=32768,
    rope_theta=1e6,
    num_experts=8,
    num_experts_per_tok=2,
    moe_intermediate_size=14336,
    norm_topk_prob=True,
)
H100 = HARDWARE["H100-SXM"]
# Read every step, in parameters: per layer attention 4096·(4096 + 2·1024) + 4096·4096 =
# 41,943,040, router 4096·8 = 32,768, norms 8,192 -> 41,984,000; 32 layers 1,343,488,000;
# final norm 4,096; lm_head 32,000·4,096 = 131,072,000. At 2 bytes: 2,949,128,192.
DENSE_BYTES = 2_949_128_192
EXPERT_PARAMS = 3 * 4096 * 14336  # 176,160,768
KV_BYTES_PER_POSITION = 2 * 1024 * 2 * 32  # K and V, 8 kv heads of 128, 2 bytes, 32 layers


def rows():
    return whatif_rows(
        MIXTRAL,
        H100["memory_bandwidth_bytes_per_s"],
        H100["flops_per_s"]["bfloat16"],
        [1024],
        [1, 64],
        2.0,
        2.0,
    )


def test_mixtral_decode_at_batch_1_reads_two_experts_per_layer():
    one = rows()[0]
    assert one["experts_touched_per_layer"] == pytest.approx(2.0)
    assert one["expert_bytes_per_step"] == 2 * 2 * 32 * EXPERT_PARAMS  # 22,548,578,304
    # dense + one gathered embedding row + 2 experts x 32 layers + KV read (1,024 positions)
    # and written (1): 25,632,063,488 bytes, ~7.65 ms at 3.35 TB/s.
    expected = DENSE_BYTES + 2 * 4096 + 22_548_578_304 + 1025 * KV_BYTES_PER_POSITION
    assert one["bytes_per_step"] == expected == 25_632_063_488
    assert one["bound"] == "memory"
    assert one["decode_step_ms"] == pytest.approx(expected / 3.35e12 * 1e3)
    # FLOPs count the 2 active experts of the token, not all 8.
    active_per_layer = 41_943_040 + 32_768 + 2 * EXPERT_PARAMS
    attention = 4 * 32 * 4096 * 1024
    assert one["flops_per_step"] == 2 * 32 * active_per_layer + attention + 2 * 4096 * 32000


def test_mixtral_decode_at_batch_64_reads_nearly_every_expert():
    big = rows()[1]
    touched = 8 * (1 - 0.75**64)  # 7.99999992
    assert big["experts_touched_per_layer"] == pytest.approx(touched)
    expert_bytes = 2 * 32 * touched * EXPERT_PARAMS
    assert big["expert_bytes_per_step"] == pytest.approx(expert_bytes)
    kv = 64 * 1025 * KV_BYTES_PER_POSITION
    assert big["bytes_per_step"] == pytest.approx(DENSE_BYTES + 64 * 2 * 4096 + expert_bytes + kv)
    # ~4x the bytes of batch 1 (every expert instead of 2), so far from 64x the step time.
    assert 3.9 < big["bytes_per_step"] / rows()[0]["bytes_per_step"] < 4.0


def test_dense_rows_have_no_experts():
    (row,) = whatif_rows(PRESETS["llama-3.1-8b"], 3.35e12, 989e12, [1024], [1], 2.0, 2.0)
    assert row["experts_touched_per_layer"] is None
    assert row["expert_bytes_per_step"] == 0
    assert 4.4 < row["decode_step_ms"] < 4.6  # the same bound as before experts existed
