"""The step's cost split by op: hand counts, and the ops add up to the cost model's step."""

from __future__ import annotations

import dataclasses

import pytest

from llmbench.engine.presets import PRESETS
from llmbench.roofline.cost_model import StepShape, step_cost
from llmbench.roofline.profile_costs import LINEARS, OPS, kernel_costs, op_costs

TINY = PRESETS["tiny"]  # h 64, 2 layers, 4 heads x 16, 2 KV heads, I 128, V 512, tied
# Qwen-style extras on the same shapes: q/k/v bias, q/k norms, an untied embedding table.
TINY_EXTRAS = dataclasses.replace(TINY, qkv_bias=True, qk_norm=True, tie_word_embeddings=False)


def test_a_tiny_decode_step_by_hand():
    """One bf16 decode row at context 10: every term counted by hand."""
    step = StepShape(decode_context_lens=(10,), weight_bytes_per_param=2, kv_bytes_per_elem=2)
    costs = op_costs(TINY, step)
    assert list(costs) == list(OPS)
    # qkv_proj [64 -> 64 + 2*32]: 2 layers x 64 x 128 weights x 2 bytes; 2 FLOPs each per token.
    assert costs["qkv_proj"].bytes == 2 * 64 * 128 * 2 == 32_768
    assert costs["qkv_proj"].flops == 2 * 2 * 64 * 128
    assert costs["o_proj"].bytes == 2 * 64 * 64 * 2
    assert costs["gate_up_proj"].bytes == 2 * 64 * 256 * 2
    assert costs["down_proj"].bytes == 2 * 128 * 64 * 2
    assert costs["rms_norm"].bytes == 2 * (2 * 2 * 64 + 64)  # two per layer + the final norm
    assert costs["lm_head"].bytes == 512 * 64 * 2 and costs["lm_head"].flops == 2 * 64 * 512
    assert costs["embedding"].bytes == 0  # tied: the table is read as the lm_head
    # K and V (2 x 32 elements of 2 bytes) in 2 layers: 256 bytes per position.
    assert costs["kv_write"].bytes == 256
    assert costs["attention"].bytes == 10 * 256
    assert costs["attention"].flops == 4 * 2 * 64 * 10  # 4 FLOPs per key, head dim and layer
    for op in ("inputs", "rope", "silu_mul", "sampling"):
        assert costs[op].bytes == costs[op].flops == 0


STEPS = [
    StepShape(decode_context_lens=(10,), weight_bytes_per_param=2, kv_bytes_per_elem=2),
    StepShape(decode_context_lens=(5, 700, 33), weight_bytes_per_param=4, kv_bytes_per_elem=4),
    StepShape(prefill=((0, 64), (64, 64)), weight_bytes_per_param=2, kv_bytes_per_elem=2),
    StepShape(
        prefill=((0, 17), (40, 1)),
        weight_bytes_per_param=0.5,
        kv_bytes_per_elem=1.0625,
        lm_head_bytes_per_param=1.03,
    ),
]


@pytest.mark.parametrize("config", [TINY, TINY_EXTRAS, PRESETS["smollm2-135m"]])
@pytest.mark.parametrize("step", STEPS)
@pytest.mark.parametrize("devices", ["one", "a KV head each", "a query head each"])
def test_the_ops_add_up_to_the_cost_models_step(config, step, devices):
    """On one device; tensor-parallel with the KV heads split (tp = KV heads), and with them
    replicated (tp = query heads: 2 devices a KV head in TINY, 3 in SmolLM2)."""
    tp = {"one": 1, "a KV head each": config.num_kv_heads, "a query head each": config.num_heads}
    step = dataclasses.replace(step, tp=tp[devices])
    costs = op_costs(config, step)
    whole = step_cost(config, step)
    assert sum(c.bytes for c in costs.values()) == pytest.approx(whole.bytes, rel=1e-12)
    assert sum(c.flops for c in costs.values()) == pytest.approx(whole.flops, rel=1e-12)
    linear_flops = sum(costs[op].flops for op in LINEARS if op != "lm_head")
    assert linear_flops == pytest.approx(whole.breakdown["linear_flops"], rel=1e-12)


def test_extras_go_to_their_ops():
    step = StepShape(decode_context_lens=(10,), weight_bytes_per_param=2, kv_bytes_per_elem=2)
    plain, extras = op_costs(TINY, step), op_costs(TINY_EXTRAS, step)
    assert extras["qkv_proj"].bytes - plain["qkv_proj"].bytes == 2 * 128 * 2  # the bias
    assert extras["rms_norm"].bytes - plain["rms_norm"].bytes == 2 * 2 * 16 * 2  # q/k norms
    assert extras["embedding"].bytes == 64 * 2  # one gathered row of the untied table


def test_a_mixture_of_experts_is_not_split():
    with pytest.raises(ValueError, match="mixture-of-experts"):
        op_costs(PRESETS["tiny-moe"], STEPS[0])


def test_kernel_costs_count_the_activations_too():
    """The kernels' cost functions count every launch's inputs and outputs: one bf16 decode
    row's RMSNorm reads x, writes out (2 x 64 x 2 bytes) and reads its weight (64 x 2)."""
    step = StepShape(decode_context_lens=(10,), weight_bytes_per_param=2, kv_bytes_per_elem=2)
    costs = kernel_costs(TINY, step, "bfloat16", block_size=16)
    per_launch = 2 * 64 * 2 + 64 * 2
    assert costs["rms_norm"].bytes == 5 * per_launch  # 2 layers x 2, and the final norm
    assert costs["silu_mul"].bytes == 2 * 3 * 128 * 2  # read gate and up, write out
    assert costs["attention"].bytes > op_costs(TINY, step)["attention"].bytes  # q, out too
