"""Roofline cost model against hand-computed FLOPs and bytes on a tiny model.

TINY: V=100, h=8, L=2 layers, 2 heads, 1 kv head, head_dim 4, I=16, so q = 2·4 = 8, kv = 1·4 = 4.
Per layer, matrices: qkv h·(q + 2kv) = 8·16 = 128, o_proj q·h = 64, MLP 3·h·I = 384 -> 576;
norms 2h = 16. Final norm 8. Embedding table V·h = 800.
num_params(): tied 800 + 2·(576 + 16) + 8 = 1992; untied + 800 (lm_head) = 2792.
At 2 bytes/param the weights read per step are 2·(2·592 + 8 + 800) = 3984 bytes (tied or not:
an untied model reads its lm_head, plus only the gathered embedding rows, 2·T·8 bytes).
K+V of one position over all layers at 2 bytes/elem: 2·kv·2·L = 2·4·2·2 = 32 bytes.
FLOPs per token through the layer matrices: 2·L·576 = 2304; lm_head per logit row 2·h·V = 1600;
attention per key attended 4·L·q = 4·2·8 = 64.
"""

from __future__ import annotations

import dataclasses

import pytest

from llmbench.engine.config import ModelConfig
from llmbench.engine.presets import PRESETS
from llmbench.roofline.cost_model import (
    BYTES_PER_ELEM,
    GGUF_BLOCKS,
    Cost,
    DraftModel,
    StepShape,
    decode_cost,
    draft_cost,
    expected_experts_touched,
    kv_heads_per_device,
    replicated_kv_width,
    ridge_batch,
    step_cost,
    time_bound_s,
)
from llmbench.roofline.datasheets import HARDWARE

TINY = ModelConfig(
    vocab_size=100,
    hidden_size=8,
    num_layers=2,
    num_heads=2,
    num_kv_heads=1,
    head_dim=4,
    intermediate_size=16,
    max_position_embeddings=64,
    tie_word_embeddings=True,
)
TINY_UNTIED = dataclasses.replace(TINY, tie_word_embeddings=False)


def shape(prefill=(), decode=(), bpp=2.0, kv_bytes=2.0, tp=1) -> StepShape:
    return StepShape(
        prefill=tuple(prefill),
        decode_context_lens=tuple(decode),
        weight_bytes_per_param=bpp,
        kv_bytes_per_elem=kv_bytes,
        tp=tp,
    )


def assert_sums(cost: Cost) -> None:
    b = cost.breakdown
    assert cost.flops == b["linear_flops"] + b["attention_flops"] + b["lm_head_flops"]
    assert cost.bytes == (
        b["weight_bytes"]
        + b["embedding_bytes"]
        + b["kv_read_bytes"]
        + b["kv_write_bytes"]
        + b["activation_bytes"]
    )


def test_tiny_num_params_is_what_the_comments_say():
    assert TINY.num_params() == 1992
    assert TINY_UNTIED.num_params() == 2792


def test_decode_one_sequence_at_context_10():
    cost = step_cost(TINY, shape(decode=[10]))
    b = cost.breakdown
    assert b["linear_flops"] == 2304  # 2·T(1)·L(2)·576
    assert b["attention_flops"] == 640  # 4·L(2)·q(8)·10 keys
    assert b["lm_head_flops"] == 1600  # 2·rows(1)·h(8)·V(100)
    assert cost.flops == 4544
    assert b["weight_bytes"] == 3984  # 2 bytes · 1992 params
    assert b["embedding_bytes"] == 0  # tied: the table is read once, as the lm_head
    assert b["kv_read_bytes"] == 320  # 10 positions · 32
    assert b["kv_write_bytes"] == 32  # 1 new token · 32
    assert b["activation_bytes"] == 0  # not counted
    assert cost.bytes == 4336
    assert cost.arithmetic_intensity == pytest.approx(4544 / 4336)
    assert_sums(cost)


def test_prefill_5_tokens_from_position_0():
    cost = step_cost(TINY, shape(prefill=[(0, 5)]))
    b = cost.breakdown
    assert b["linear_flops"] == 11520  # 2·T(5)·2·576
    assert b["attention_flops"] == 960  # causal keys 1+2+3+4+5 = 15; 64·15
    assert b["lm_head_flops"] == 1600  # logits for the last row only
    assert b["kv_read_bytes"] == 160  # the 5-position context once per layer, not per query
    assert b["kv_write_bytes"] == 160  # 5 new tokens · 32
    assert cost.bytes == 3984 + 160 + 160
    assert_sums(cost)


def test_chunked_prefill_3_tokens_from_position_5():
    cost = step_cost(TINY, shape(prefill=[(5, 3)]))
    b = cost.breakdown
    assert b["linear_flops"] == 6912  # 2·3·2·576
    assert b["attention_flops"] == 1344  # keys 6+7+8 = 21 = 3·5 + 3·4/2; 64·21
    assert b["lm_head_flops"] == 1600
    assert b["kv_read_bytes"] == 256  # context 5 + 3 = 8 positions · 32
    assert b["kv_write_bytes"] == 96  # 3 new · 32


def test_mixed_step_is_the_parts_with_weights_read_once():
    # Prefill chunk (5, 3) + decodes at contexts 10 and 4: T = 3 + 2 = 5, logit rows 1 + 2 = 3,
    # keys 21 + 10 + 4 = 35, positions read 8 + 10 + 4 = 22.
    step = shape(prefill=[(5, 3)], decode=[10, 4])
    assert (step.num_tokens, step.num_logit_rows) == (5, 3)
    cost = step_cost(TINY, step)
    b = cost.breakdown
    assert b["linear_flops"] == 11520  # 2·5·2·576
    assert b["attention_flops"] == 2240  # 64·35
    assert b["lm_head_flops"] == 4800  # 3·1600
    assert cost.flops == 18560
    assert b["weight_bytes"] == 3984  # once per step, not once per sequence
    assert b["kv_read_bytes"] == 704  # 22·32
    assert b["kv_write_bytes"] == 160  # 5·32
    assert cost.bytes == 3984 + 704 + 160
    # FLOPs add up over the parts; bytes too, less the weights counted once per part.
    parts = [shape(prefill=[(5, 3)]), shape(decode=[10]), shape(decode=[4])]
    part_costs = [step_cost(TINY, p) for p in parts]
    assert cost.flops == sum(c.flops for c in part_costs)
    assert cost.bytes == sum(c.bytes for c in part_costs) - 2 * 3984
    untied = step_cost(TINY_UNTIED, step)
    assert untied.breakdown["embedding_bytes"] == 80  # 5 gathered rows · h(8) · 2 bytes


def test_gqa_shrinks_kv_not_attention_flops():
    # MHA: 2 kv heads, kv = 8: K+V per position 2·8·2·2 = 64 bytes (GQA: 32).
    mha = dataclasses.replace(TINY, num_kv_heads=2)
    gqa_cost = step_cost(TINY, shape(decode=[10]))
    mha_cost = step_cost(mha, shape(decode=[10]))
    assert mha_cost.breakdown["kv_read_bytes"] == 640  # 10·64
    assert mha_cost.breakdown["kv_write_bytes"] == 64
    assert mha_cost.breakdown["kv_read_bytes"] == 2 * gqa_cost.breakdown["kv_read_bytes"]
    # Attention FLOPs follow the query heads: 4·2·8·10 either way.
    assert mha_cost.breakdown["attention_flops"] == gqa_cost.breakdown["attention_flops"] == 640
    # The k/v projections grow: qkv h·(8 + 16) = 192 + o 64 + MLP 384 = 640 per layer.
    assert mha_cost.breakdown["linear_flops"] == 2 * 2 * 640


def test_int8_kv_halves_kv_bytes():
    kv16 = step_cost(TINY, shape(prefill=[(5, 3)], decode=[10], kv_bytes=2))
    kv8 = step_cost(TINY, shape(prefill=[(5, 3)], decode=[10], kv_bytes=1))
    for key in ("kv_read_bytes", "kv_write_bytes"):
        assert kv8.breakdown[key] == kv16.breakdown[key] / 2
    assert kv8.breakdown["kv_read_bytes"] == (8 + 10) * 16  # 16 bytes per position at int8
    assert kv8.breakdown["weight_bytes"] == kv16.breakdown["weight_bytes"]
    assert kv8.flops == kv16.flops


def test_weight_bytes_tied_vs_untied_at_4_bytes_per_param():
    step = shape(decode=[10], bpp=4)
    tied = step_cost(TINY, step).breakdown
    untied = step_cost(TINY_UNTIED, step).breakdown
    # Tied: every parameter is read exactly once (the table, as the lm_head): 4·1992.
    assert tied["weight_bytes"] == 4 * TINY.num_params() == 7968
    assert tied["embedding_bytes"] == 0
    # Untied: every parameter except the embedding table (V·h = 800) is read in full ...
    assert untied["weight_bytes"] == 4 * (TINY_UNTIED.num_params() - 800) == 7968
    # ... and of the table only the gathered row: T(1)·h(8)·4 bytes.
    assert untied["embedding_bytes"] == 32


def test_quantized_weights_scale_weight_bytes_only():
    q4 = step_cost(TINY, shape(decode=[10], bpp=0.5625))
    assert q4.breakdown["weight_bytes"] == 0.5625 * 1992
    assert q4.breakdown["kv_read_bytes"] == 320


def test_tensor_parallel_reports_per_device_numbers():
    split = dataclasses.replace(TINY, num_kv_heads=2)  # q 8, kv 8: matrices 8·24 + 64 + 384
    b = step_cost(split, shape(decode=[10], tp=2)).breakdown
    assert b["linear_flops"] == 1280  # 2·2·640 / 2
    assert b["attention_flops"] == 320  # heads split: 640 / 2
    assert b["lm_head_flops"] == 800  # vocab-parallel: 1600 / 2
    # Matrices and lm_head split, norms replicated: 2·(2·(640/2 + 16) + 8 + 800/2) = 2160.
    assert b["weight_bytes"] == 2160
    # KV heads split, one a device: 10 positions · 2 · d 4 · 2 bytes · 2 layers.
    assert b["kv_read_bytes"] == 320
    assert b["kv_write_bytes"] == 32


def test_tensor_parallel_past_the_kv_heads_replicates_them():
    # TINY's one KV head on each of 2 devices (its k_proj, v_proj columns and its K/V cache):
    # each device holds what it would with 2 KV heads split one a device, as above.
    replicated = step_cost(TINY, shape(decode=[10], tp=2)).breakdown
    split = step_cost(dataclasses.replace(TINY, num_kv_heads=2), shape(decode=[10], tp=2))
    assert replicated == split.breakdown
    assert (
        replicated["kv_read_bytes"]
        == step_cost(TINY, shape(decode=[10])).breakdown["kv_read_bytes"]
    )
    assert replicated_kv_width(TINY, 2) == 4  # 2·d·(1 − 1/2)
    assert replicated_kv_width(TINY, 1) == 0


def test_tensor_parallel_must_shard_the_heads_evenly():
    wide = dataclasses.replace(TINY, num_heads=12, num_kv_heads=4)
    assert [kv_heads_per_device(wide, tp) for tp in (1, 2, 4, 12)] == [4, 2, 1, 1]
    with pytest.raises(ValueError, match="does not divide the model's 12 attention heads"):
        kv_heads_per_device(wide, 8)
    with pytest.raises(ValueError, match="4 KV heads neither split"):
        kv_heads_per_device(wide, 6)  # divides 12 heads; 4 KV heads over 6 devices: no
    with pytest.raises(ValueError, match="attention heads"):
        step_cost(TINY, shape(decode=[1], tp=3))


def test_bad_shapes_are_rejected():
    with pytest.raises(ValueError):
        shape(prefill=[(0, 0)])
    with pytest.raises(ValueError):
        shape(decode=[0])
    with pytest.raises(ValueError):
        shape(decode=[1], tp=0)


def test_decode_step_time_bound_is_the_slower_roof():
    # Batch 1 at context 10: 4336 bytes, 4544 FLOPs (test above).
    cost = decode_cost(TINY, 1, 10, 2, 2)
    assert time_bound_s(cost, 2168.0, 1e9) == pytest.approx(2.0)
    assert time_bound_s(cost, 1e9, 2272.0) == pytest.approx(2.0)


def test_ridge_batch_on_a_hand_made_device():
    # Decode at context 1, per sequence: FLOPs 2304 + 64 + 1600 = 3968; bytes 32 read + 32
    # written = 64; constant 3984 weight bytes. Device: 1 B/s, 31 FLOP/s, so one sequence costs
    # 3968 / 31 = 128 s of compute: 128·B >= 3984 + 64·B  <=>  B >= 62.25  ->  63.
    hw = {"memory_bandwidth_bytes_per_s": 1.0, "flops_per_s": {"bfloat16": 31.0}}
    args = (TINY, 1, 2, 2, hw["memory_bandwidth_bytes_per_s"])
    assert ridge_batch(*args, hw["flops_per_s"]["bfloat16"]) == 63
    # At 124 FLOP/s a sequence's compute (32 s) never catches up with its KV bytes (64 s).
    assert ridge_batch(*args, 124.0) is None


def test_smollm2_decode_reads_every_weight_once():
    config = PRESETS["smollm2-135m"]
    cost = step_cost(config, shape(decode=[1], bpp=2))
    assert cost.breakdown["weight_bytes"] == 2 * config.num_params()  # tied
    assert cost.breakdown["embedding_bytes"] == 0
    # K+V per position: 2·(3·64)·2 bytes·30 layers = 23040; context 1 read, 1 written.
    assert cost.breakdown["kv_read_bytes"] == cost.breakdown["kv_write_bytes"] == 23040
    # Bandwidth-bound at batch 1 on an H100: ~1 FLOP per byte, far below the ridge (~295).
    h100 = HARDWARE["H100-SXM"]
    ridge = h100["flops_per_s"]["bfloat16"] / h100["memory_bandwidth_bytes_per_s"]
    assert cost.arithmetic_intensity < ridge


@pytest.mark.parametrize("arch, tied", [("llama", False), ("llama", True), ("qwen2", False)])
def test_weight_bytes_equal_what_the_loaded_model_reads(tmp_path, arch, tied):
    """The cost model's weights-per-step against the engine's own tensors (every matrix,
    norm and bias once; of an untied embedding only the gathered row), in two dtypes."""
    import torch

    from llmbench.engine.engine import EngineConfig, LLMEngine
    from tests.engine.helpers import write_tiny_checkpoint

    folder = write_tiny_checkpoint(tmp_path, arch=arch, tied=tied)
    for dtype, elem_bytes in (("float32", 4), ("bfloat16", 2)):
        engine = LLMEngine(EngineConfig(model=str(folder), dtype=dtype, device="cpu"))
        assert engine.dtype == getattr(torch, dtype)
        shape = StepShape(
            decode_context_lens=(1,), weight_bytes_per_param=elem_bytes, kv_bytes_per_elem=2
        )
        b = step_cost(engine.model_config, shape).breakdown
        # Tied in float32, the engine keeps the lm_head input-major (a transposed copy, for the
        # GEMV), so it also gathers the token's row from the embedding table: h more bytes.
        model = engine.model
        extra_row = tied and model.lm_head.weight is not model.embed_tokens
        row_bytes = engine.model_config.hidden_size * elem_bytes if extra_row else 0
        assert b["weight_bytes"] + b["embedding_bytes"] + row_bytes == _decode_weight_bytes(model)


def test_gguf_bytes_per_weight_match_the_block_layouts():
    """Every GGUF format in the table against the gguf package's own (block, bytes) sizes,
    and the three a user meets most by hand: Q4_0 4.5 bits, Q4_1 5 bits, Q8_0 8.5 bits."""
    import gguf

    for name, (num_weights, num_bytes) in GGUF_BLOCKS.items():
        qtype = gguf.GGMLQuantizationType[name.upper()]
        assert gguf.GGML_QUANT_SIZES[qtype] == (num_weights, num_bytes), name
    assert BYTES_PER_ELEM["q4_0"] == 0.5625  # (16 + 2) / 32
    assert BYTES_PER_ELEM["q4_1"] == 0.625  # (16 + 2 + 2) / 32
    assert BYTES_PER_ELEM["q8_0"] == 1.0625  # (32 + 2) / 32


def _decode_weight_bytes(model) -> int:
    """Weight bytes one decode step of the loaded model reads, from its own tensors: every
    matrix once, but of an untied embedding table only the one row it gathers."""
    total = model.norm.numel() * model.norm.element_size() + model.lm_head.num_bytes
    for layer in model.layers:
        norms = (layer.input_norm, layer.post_attention_norm)
        total += sum(t.numel() * t.element_size() for t in norms)
        linears = (layer.qkv_proj, layer.o_proj, layer.gate_up_proj, layer.down_proj)
        total += sum(linear.num_bytes for linear in linears)
    if model.lm_head.weight is not model.embed_tokens:
        total += model.embed_tokens.shape[1] * model.embed_tokens.element_size()
    return total


# -- mixture of experts --------------------------------------------------------------------------
#
# TINY_MOE: TINY's attention with E=4 experts, top-k 2, I_moe=6, no shared expert.
# Per layer, always read: qkv 128 + o_proj 64 + router h·E = 32 -> 224; norms 16.
# One expert: 3·h·I_moe = 3·8·6 = 144. All parameters: 800 + 2·(224 + 16 + 4·144) + 8 = 2440;
# active per token (2 experts): 800 + 2·(224 + 16 + 2·144) + 8 = 1864.
# At 2 bytes/param the dense part read per step is 2·(2·240 + 8 + 800) = 2576.
TINY_MOE = dataclasses.replace(TINY, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=6)


def test_moe_step_reads_only_the_experts_its_tokens_were_routed_to():
    """Three decode tokens (contexts 10, 4, 7) with a hand-written routing: layer 0 reaches
    experts {0, 1, 2}, layer 1 only {0, 3}."""
    routing = [
        [{0, 1}, {1, 2}, {0, 2}],  # layer 0: tokens A, B, C
        [{3, 0}, {0, 3}, {0, 3}],  # layer 1
    ]
    touched = tuple(len(set().union(*layer)) for layer in routing)
    assert touched == (3, 2)
    cost = step_cost(TINY_MOE, StepShape(decode_context_lens=(10, 4, 7), experts_touched=touched))
    b = cost.breakdown
    assert b["weight_bytes"] == 2576  # attention, router, norms, lm_head: once per step
    assert b["expert_bytes"] == 1440  # 2 bytes · (3 + 2) experts · 144
    assert b["kv_read_bytes"] == 672  # (10 + 4 + 7) positions · 32
    assert b["kv_write_bytes"] == 96  # 3 tokens · 32
    assert cost.bytes == 2576 + 1440 + 672 + 96
    # FLOPs: every token runs its 2 experts whatever the others do: 2·T(3)·L(2)·(224 + 2·144).
    assert b["linear_flops"] == 6144
    assert b["attention_flops"] == 1344  # 64 · 21 keys: attention is unchanged
    assert b["lm_head_flops"] == 4800  # 3 rows · 1600
    assert cost.flops == 6144 + 1344 + 4800
    assert_sums_moe(cost)


def test_moe_step_touching_every_expert_reads_every_parameter():
    assert (TINY_MOE.num_params(), TINY_MOE.num_active_params()) == (2440, 1864)
    cost = step_cost(TINY_MOE, StepShape(decode_context_lens=(1,), experts_touched=(4, 4)))
    assert cost.breakdown["weight_bytes"] + cost.breakdown["expert_bytes"] == 2 * 2440
    # Touching only its top-k, a single token reads exactly the active parameters.
    one = step_cost(TINY_MOE, StepShape(decode_context_lens=(1,), experts_touched=(2, 2)))
    assert one.breakdown["weight_bytes"] + one.breakdown["expert_bytes"] == 2 * 1864
    # One token through 2 experts in both layers: 2·(224 + 288) FLOPs per layer.
    assert cost.breakdown["linear_flops"] == 2 * 2 * 512


def test_moe_what_if_uses_the_uniform_routing_expectation():
    # Batch 1: one token touches exactly its k = 2 experts per layer.
    one = decode_cost(TINY_MOE, 1, 10, 2, 2)
    assert one.breakdown["expert_bytes"] == 2 * 2 * 2 * 144
    # Batch 3: E·(1 − (1 − k/E)^3) = 4·(1 − 1/8) = 3.5 experts per layer.
    three = decode_cost(TINY_MOE, 3, 10, 2, 2)
    assert three.breakdown["expert_bytes"] == pytest.approx(2 * 2 * 3.5 * 144)
    # A long prefill reaches every expert (to within 2^-1024).
    prefill = step_cost(TINY_MOE, StepShape(prefill=((0, 1024),)))
    assert prefill.breakdown["expert_bytes"] == pytest.approx(2 * 2 * 4 * 144)


def test_dense_models_have_no_expert_bytes():
    cost = step_cost(TINY, shape(decode=[10]))
    assert cost.breakdown["expert_bytes"] == 0
    assert step_cost(TINY, StepShape(decode_context_lens=(10,), experts_touched=(3, 2))) == cost


def test_moe_shared_expert_and_qk_norm_are_read_every_step():
    # A shared expert of width 5 (3·8·5 = 120) and its [h, 1] gate (8); q_norm and k_norm of
    # head_dim 4 each. Per layer: 224 + 128 matrix, 16 + 8 norm.
    config = dataclasses.replace(TINY_MOE, shared_expert_intermediate_size=5, qk_norm=True)
    cost = step_cost(config, StepShape(decode_context_lens=(1,), experts_touched=(2, 2)))
    assert cost.breakdown["weight_bytes"] == 2 * (2 * (352 + 24) + 8 + 800)
    all_read = step_cost(config, StepShape(decode_context_lens=(1,), experts_touched=(4, 4)))
    assert all_read.breakdown["weight_bytes"] + all_read.breakdown["expert_bytes"] == (
        2 * config.num_params()
    )
    assert cost.breakdown["linear_flops"] == 2 * 2 * (352 + 2 * 144)


def test_experts_touched_must_name_every_layer():
    with pytest.raises(ValueError, match="2 layers, the model 2|3 layers, the model 2"):
        step_cost(TINY_MOE, StepShape(decode_context_lens=(1,), experts_touched=(1, 1, 1)))


def test_expected_experts_touched_by_hand():
    assert expected_experts_touched(8, 2, 0) == 0
    assert expected_experts_touched(8, 2, 1) == pytest.approx(2)
    assert expected_experts_touched(8, 2, 2) == pytest.approx(8 * (1 - 0.75**2))  # 3.5
    assert expected_experts_touched(8, 8, 1) == 8  # top-k = E: every token reads every expert
    assert expected_experts_touched(0, 0, 64) == 0  # dense
    with pytest.raises(ValueError):
        expected_experts_touched(8, 9, 1)


@pytest.mark.parametrize(
    "num_experts, top_k, num_tokens", [(8, 2, 1), (8, 2, 4), (8, 2, 16), (64, 8, 3), (128, 8, 32)]
)
def test_expected_experts_touched_matches_a_seeded_simulation(num_experts, top_k, num_tokens):
    """Uniform top-k routing simulated: each token picks k distinct experts at random; the mean
    distinct count over many trials is within 4 standard errors of the formula."""
    import numpy as np

    rng = np.random.default_rng(1234)
    num_trials = 4000
    # [trials, tokens, E] random keys; a token's k smallest keys are a uniform k-subset.
    keys = rng.random((num_trials, num_tokens, num_experts))
    chosen = np.argsort(keys, axis=-1)[..., :top_k]  # [trials, tokens, k]
    hit = np.zeros((num_trials, num_experts), dtype=bool)
    np.put_along_axis(hit, chosen.reshape(num_trials, -1), True, axis=1)
    distinct = hit.sum(axis=1)
    standard_error = distinct.std(ddof=1) / np.sqrt(num_trials)
    expected = expected_experts_touched(num_experts, top_k, num_tokens)
    assert abs(distinct.mean() - expected) <= 4 * standard_error + 1e-9


def test_ridge_batch_of_a_moe_model_counts_the_experts_its_batch_reaches():
    """Decode at context 1, per sequence: FLOPs 2·2·512 + 64 + 1600 = 3712, KV bytes 64. At
    1 B/s and 50 FLOP/s a sequence costs 74.24 s of compute against 64 s of KV, so the ridge is
    where 10.24·B covers the weights: 2576 dense + (by then every expert) 2·2·4·144 = 2304,
    B >= 476.6 -> 477. The condition flips there, experts-touched expectation included."""
    bandwidth, peak = 1.0, 50.0
    ridge = ridge_batch(TINY_MOE, 1, 2, 2, bandwidth, peak)
    assert ridge == 477

    def is_compute_bound(batch: int) -> bool:
        cost = decode_cost(TINY_MOE, batch, 1, 2, 2)
        return cost.flops / peak >= cost.bytes / bandwidth

    assert is_compute_bound(ridge) and not is_compute_bound(ridge - 1)


def test_link_bytes_are_a_roof_of_their_own():
    cost = step_cost(TINY, StepShape(decode_context_lens=(10,), link_bytes=1000.0))
    assert cost.link_bytes == 1000.0
    assert cost.bytes == 4336  # memory bytes unchanged (test above)
    assert time_bound_s(cost, 4336.0, 1e9) == pytest.approx(1.0)
    assert time_bound_s(cost, 4336.0, 1e9, link_bytes_per_s=250.0) == pytest.approx(4.0)


def assert_sums_moe(cost: Cost) -> None:
    b = cost.breakdown
    assert cost.bytes == (
        b["weight_bytes"]
        + b["expert_bytes"]
        + b["embedding_bytes"]
        + b["kv_read_bytes"]
        + b["kv_write_bytes"]
        + b["activation_bytes"]
    )


def test_verified_draft_tokens_need_lm_head_rows_but_no_more_bytes():
    # A sequence with 10 computed tokens verifies 3 drafts: a chunk of 4 rows at 10, every row
    # with logits. linear 4·2304 = 9216; attention keys 4·10 + 4·5/2 = 50, ·64 = 3200;
    # lm_head 4 rows · 1600 = 6400 (1600 without the drafts' rows).
    # Bytes: weights 3984 + K/V read (10 + 4)·32 = 448 + written 4·32 = 128 = 4560.
    cost = step_cost(TINY, StepShape(prefill=((10, 4),), num_draft_tokens=3))
    assert cost.breakdown["lm_head_flops"] == 6400
    assert cost.flops == 9216 + 3200 + 6400
    assert cost.bytes == 4560 == step_cost(TINY, StepShape(prefill=((10, 4),))).bytes
    with pytest.raises(ValueError, match="num_draft_tokens -1: must be >= 0"):
        StepShape(prefill=((10, 4),), num_draft_tokens=-1)


def test_a_draft_model_reads_its_weights_once_per_pass():
    # TINY as its own draft: a 6-token catch-up, then drafts 1 and 2 one row each.
    # Pass 1 (0, 6): 6·2304 + 21 keys·64 + 1600 = 16768 FLOPs; 3984 + 6·32 + 6·32 = 4368 B.
    # Pass 2 (6, 1): 2304 + 7·64 + 1600 = 4352; 3984 + 7·32 + 32 = 4240.
    # Pass 3 (7, 1): 2304 + 8·64 + 1600 = 4416; 3984 + 8·32 + 32 = 4272.
    draft = DraftModel(TINY, weight_bytes_per_param=2.0, kv_bytes_per_elem=2.0)
    cost = draft_cost(draft, (((6, 6),), ((7, 1),), ((8, 1),)))
    assert cost.flops == 16768 + 4352 + 4416
    assert cost.bytes == 4368 + 4240 + 4272
    assert cost.breakdown["weight_bytes"] == 3 * 3984
    assert draft_cost(draft, ()).bytes == 0
    # An int8 draft (its lm_head too): 1 byte a weight, half the 16-bit bytes: 3 · 3984 / 2.
    int8 = DraftModel(TINY, 1.0, 2.0, lm_head_bytes_per_param=1.0)
    assert draft_cost(int8, (((6, 6),), ((7, 1),), ((8, 1),))).breakdown["weight_bytes"] == (
        3 * 3984 / 2
    )
