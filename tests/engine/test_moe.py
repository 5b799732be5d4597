"""The MoE MLP: routing, grouped-by-expert execution against a per-token reference, and the whole
model against `transformers` (Mixtral, Qwen2-MoE, Qwen3-MoE) on tiny random checkpoints."""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F

from llmbench.engine.config import ModelConfig, config_from_hf
from llmbench.engine.engine import EngineConfig, LLMEngine
from llmbench.engine.hf_folder import HFFolderSource, canonical_name
from llmbench.engine.linear import Linear
from llmbench.engine.moe import MoEMLP, Routing, mean_load_max_over_mean, route
from llmbench.engine.sampling import SamplingParams
from llmbench.errors import UserError
from tests.engine.helpers import VOCAB, write_tokenizer
from tests.engine.test_model import NUM_DECODE_STEPS, _hf_greedy, _our_logits

# Tiny MoE checkpoints: 2 layers, hidden 64, 4 heads of 16 (2 KV heads), 4 experts of 32, top-2.
COMMON = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=512,
    num_experts_per_tok=2,
    rms_norm_eps=1e-5,
)
ARCHS = ["mixtral", "qwen2-moe", "qwen3-moe"]


def write_tiny_moe_checkpoint(folder, arch: str, seed: int = 0):
    """Save a 2-layer random-weight HF MoE model to folder (norm weights random too, so that
    Qwen3's per-head q/k norm weights are tested in their permuted order)."""
    from transformers import (
        MixtralConfig,
        MixtralForCausalLM,
        Qwen2MoeConfig,
        Qwen2MoeForCausalLM,
        Qwen3MoeConfig,
        Qwen3MoeForCausalLM,
    )

    torch.manual_seed(seed)
    rope = {"rope_type": "default", "rope_theta": 10000.0}
    if arch == "mixtral":
        config = MixtralConfig(
            **COMMON, intermediate_size=32, num_local_experts=4, rope_parameters=rope
        )
        model = MixtralForCausalLM(config)
    elif arch == "qwen2-moe":
        config = Qwen2MoeConfig(
            **COMMON,
            intermediate_size=96,
            moe_intermediate_size=32,
            shared_expert_intermediate_size=48,
            num_experts=4,
            norm_topk_prob=False,
            rope_parameters=rope,
        )
        model = Qwen2MoeForCausalLM(config)
    else:
        config = Qwen3MoeConfig(
            **COMMON,
            intermediate_size=96,
            moe_intermediate_size=32,
            num_experts=4,
            norm_topk_prob=True,
            rope_parameters=rope,
        )
        model = Qwen3MoeForCausalLM(config)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.copy_(1.0 + 0.3 * torch.randn_like(p))  # norms (and Qwen2's biases)
            else:
                p.normal_(0.0, 0.1)  # logits far from uniform: argmax is stable
    model.save_pretrained(folder, safe_serialization=True)
    write_tokenizer(folder)
    return folder


@pytest.fixture(scope="module", params=ARCHS)
def moe_folder(request, tmp_path_factory):
    return write_tiny_moe_checkpoint(tmp_path_factory.mktemp(request.param), request.param)


# --- routing ----------------------------------------------------------------------------------


def test_softmax_routing_renormalised_and_not():
    logits = torch.tensor([[math.log(1.0), math.log(2.0), math.log(3.0), math.log(4.0)]])
    weights, ids = route(logits, 2, "softmax", normalize=False)
    assert ids.tolist() == [[3, 2]]
    assert torch.allclose(weights, torch.tensor([[0.4, 0.3]]))  # 4/10, 3/10
    weights, _ = route(logits, 2, "softmax", normalize=True)
    assert torch.allclose(weights, torch.tensor([[4 / 7, 3 / 7]]))


def test_sigmoid_routing():
    logits = torch.tensor([[0.0, 2.0, -1.0]])
    weights, ids = route(logits, 2, "sigmoid", normalize=False)
    assert ids.tolist() == [[1, 0]]
    s1, s0 = 1 / (1 + math.exp(-2.0)), 0.5
    assert torch.allclose(weights, torch.tensor([[s1, s0]]))
    weights, _ = route(logits, 2, "sigmoid", normalize=True)
    assert torch.allclose(weights, torch.tensor([[s1 / (s1 + s0), s0 / (s1 + s0)]]))


def test_routing_counts_and_load():
    routing = Routing(torch.zeros(0), torch.zeros(0), tokens_per_expert=(3, 0, 1, 0))
    assert routing.num_experts_touched == 2
    # 4 slots over 4 experts: mean 1, max 3.
    assert routing.load_max_over_mean == 3.0
    even = Routing(torch.zeros(0), torch.zeros(0), tokens_per_expert=(1, 1, 1, 1))
    assert mean_load_max_over_mean([routing, even]) == 2.0
    assert mean_load_max_over_mean([]) is None


# --- grouped execution against a per-token loop -------------------------------------------------


def _random_moe_config(shared: int, scoring: str, normalize: bool) -> ModelConfig:
    return ModelConfig(
        vocab_size=32,
        hidden_size=24,
        num_layers=1,
        num_heads=2,
        num_kv_heads=1,
        head_dim=12,
        intermediate_size=8,
        max_position_embeddings=64,
        num_experts=6,
        num_experts_per_tok=3,
        moe_intermediate_size=10,
        shared_expert_intermediate_size=shared,
        router_scoring=scoring,
        norm_topk_prob=normalize,
    )


def _random_moe_weights(config: ModelConfig, seed: int) -> dict[str, torch.Tensor]:
    from llmbench.engine.checkpoint import expected_tensors

    g = torch.Generator().manual_seed(seed)
    return {
        name.removeprefix("model.layers.0."): torch.randn(shape, generator=g)
        for name, shape in expected_tensors(config).items()
        if name.startswith("model.layers.0.mlp.")
    }


def _reference_moe(x, w, config: ModelConfig) -> torch.Tensor:
    """One token at a time, one expert at a time: the definition of the layer."""
    out = torch.zeros_like(x)
    for t in range(x.shape[0]):
        logits = w["mlp.gate.weight"] @ x[t]
        scores = logits.softmax(-1) if config.router_scoring == "softmax" else logits.sigmoid()
        top = scores.topk(config.num_experts_per_tok)
        weights = top.values / top.values.sum() if config.norm_topk_prob else top.values
        for weight, e in zip(weights, top.indices.tolist(), strict=True):
            p = f"mlp.experts.{e}."
            act = F.silu(w[p + "gate_proj.weight"] @ x[t]) * (w[p + "up_proj.weight"] @ x[t])
            out[t] += weight * (w[p + "down_proj.weight"] @ act)
        if config.shared_expert_intermediate_size:
            p = "mlp.shared_expert."
            act = F.silu(w[p + "gate_proj.weight"] @ x[t]) * (w[p + "up_proj.weight"] @ x[t])
            gate = torch.sigmoid(w["mlp.shared_expert_gate.weight"] @ x[t])
            out[t] += gate * (w[p + "down_proj.weight"] @ act)
    return out


@pytest.mark.parametrize(
    "shared, scoring, normalize",
    [(0, "softmax", True), (0, "softmax", False), (16, "softmax", False), (0, "sigmoid", True)],
)
@pytest.mark.parametrize("num_tokens", [1, 2, 37])
def test_grouped_execution_matches_the_per_token_definition(shared, scoring, normalize, num_tokens):
    config = _random_moe_config(shared, scoring, normalize)
    weights = _random_moe_weights(config, seed=num_tokens)
    moe = MoEMLP.build(config, weights, "mlp.", Linear.build)
    g = torch.Generator().manual_seed(100 + num_tokens)
    x = torch.randn(num_tokens, config.hidden_size, generator=g)
    residual = torch.randn(num_tokens, config.hidden_size, generator=g)
    out, routing = moe(x, residual)
    expected = residual + _reference_moe(x, weights, config)
    assert torch.allclose(out, expected, atol=1e-4, rtol=1e-4)
    assert sum(routing.tokens_per_expert) == num_tokens * config.num_experts_per_tok
    assert routing.expert_ids.shape == (num_tokens, config.num_experts_per_tok)
    # The residual is not written in place.
    assert not torch.equal(out, residual)


# --- the whole model against transformers -------------------------------------------------------


def test_prefill_and_decode_logits_match_transformers(moe_folder):
    prompt = torch.randint(0, VOCAB, (37,), generator=torch.Generator().manual_seed(1)).tolist()
    hf_tokens, hf_logits = _hf_greedy(moe_folder, prompt)
    ours = _our_logits(moe_folder, prompt, hf_tokens, block_size=16)
    assert len(ours) == len(hf_logits) == NUM_DECODE_STEPS + 1
    for step, (a, b) in enumerate(zip(ours, hf_logits, strict=True)):
        diff = (a - b).abs().max().item()
        assert diff < 1e-4, f"step {step}: max abs logit diff {diff}"


def test_engine_greedy_tokens_match_transformers(moe_folder):
    prompts = [
        torch.randint(0, VOCAB, (n,), generator=torch.Generator().manual_seed(n)).tolist()
        for n in (5, 16, 33)
    ]
    engine = LLMEngine(EngineConfig(model=str(moe_folder), device="cpu", kv_cache_memory=1 << 22))
    params = SamplingParams(max_tokens=NUM_DECODE_STEPS, temperature=0.0, ignore_eos=True)
    ours = engine.generate(prompts, params)
    for prompt, tokens in zip(prompts, ours, strict=True):
        hf_tokens, _ = _hf_greedy(moe_folder, prompt)
        assert tokens == hf_tokens[:NUM_DECODE_STEPS]
    records = list(engine.step_records)
    assert all(len(r.experts_touched) == 2 for r in records)
    assert all(1 <= n <= 4 for r in records for n in r.experts_touched)
    assert all(r.expert_load_max_over_mean >= 1.0 for r in records)


# --- configs and names -------------------------------------------------------------------------


def test_hf_configs_become_moe_model_configs(moe_folder):
    config = HFFolderSource(moe_folder).config
    assert config.is_moe and config.num_experts == 4 and config.num_experts_per_tok == 2
    assert config.moe_intermediate_size == 32
    arch = json.loads((moe_folder / "config.json").read_text())["architectures"][0]
    expected = {
        "MixtralForCausalLM": dict(shared=0, norm=True, qk_norm=False, bias=False),
        "Qwen2MoeForCausalLM": dict(shared=48, norm=False, qk_norm=False, bias=True),
        "Qwen3MoeForCausalLM": dict(shared=0, norm=True, qk_norm=True, bias=False),
    }[arch]
    assert config.shared_expert_intermediate_size == expected["shared"]
    assert config.norm_topk_prob == expected["norm"]
    assert config.qk_norm == expected["qk_norm"]
    assert config.qkv_bias == expected["bias"]


QWEN3_MOE = {
    "architectures": ["Qwen3MoeForCausalLM"],
    "vocab_size": 100,
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 96,
    "moe_intermediate_size": 32,
    "num_experts": 8,
    "num_experts_per_tok": 2,
}


@pytest.mark.parametrize(
    "change, message",
    [
        ({"mlp_only_layers": [1]}, "mlp_only_layers"),
        ({"decoder_sparse_step": 2}, "decoder_sparse_step"),
        ({"use_sliding_window": True}, "sliding-window"),
        ({"num_experts": 0}, "num_experts"),
        ({"num_experts_per_tok": 9}, "num_experts_per_tok"),
    ],
)
def test_unsupported_moe_configs_are_refused_in_one_line(change, message):
    with pytest.raises(UserError) as err:
        config_from_hf({**QWEN3_MOE, **change}, "config.json")
    assert message in str(err.value) and "\n" not in str(err.value)


def test_mixtral_tensor_names_become_qwen_moe_names():
    p = "model.layers.3."
    assert canonical_name(p + "block_sparse_moe.gate.weight") == p + "mlp.gate.weight"
    assert (
        canonical_name(p + "block_sparse_moe.experts.7.w1.weight")
        == p + "mlp.experts.7.gate_proj.weight"
    )
    assert (
        canonical_name(p + "block_sparse_moe.experts.7.w3.weight")
        == p + "mlp.experts.7.up_proj.weight"
    )
    assert (
        canonical_name(p + "block_sparse_moe.experts.7.w2.weight")
        == p + "mlp.experts.7.down_proj.weight"
    )
    assert canonical_name(p + "self_attn.q_proj.weight") == p + "self_attn.q_proj.weight"


def test_a_missing_expert_is_a_clear_error(tmp_path):
    from safetensors.torch import load_file, save_file

    folder = write_tiny_moe_checkpoint(tmp_path, "qwen3-moe")
    tensors = load_file(folder / "model.safetensors")
    del tensors["model.layers.1.mlp.experts.3.up_proj.weight"]
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(UserError, match="model.layers.1.mlp.experts.3.up_proj.weight' is missing"):
        LLMEngine(EngineConfig(model=str(folder), device="cpu", kv_cache_memory=1 << 22))


# --- serving on tiny-moe -----------------------------------------------------------------------

GREEDY = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)


def _tiny_moe_engine(**overrides) -> LLMEngine:
    return LLMEngine(
        EngineConfig(model="synthetic:tiny-moe", device="cpu", kv_cache_memory=1 << 22, **overrides)
    )


def test_concurrent_requests_give_the_tokens_each_gives_alone():
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(0, 256, (n,), generator=g).tolist() for n in (9, 23, 40)]
    alone = [_tiny_moe_engine().generate([p], GREEDY)[0] for p in prompts]
    engine = _tiny_moe_engine(max_num_batched_tokens=16)  # chunked prefill beside decodes
    together = engine.generate(prompts, GREEDY)
    assert together == alone
    assert any(r.num_prefill_tokens and r.num_decode_seqs for r in engine.step_records)


def test_prefix_cache_hit_changes_nothing_on_tiny_moe():
    shared = list(range(40, 90))  # 50 tokens: 3 full blocks of 16 + 2
    first, second = shared + [1, 2, 3], shared + [7, 8]
    outputs = {}
    for caching in (True, False):
        engine = _tiny_moe_engine(block_size=16, enable_prefix_caching=caching)
        a = engine.generate([first], GREEDY)[0]
        b = engine.generate([second], GREEDY)[0]
        outputs[caching] = (a, b, engine.prefix_cache_hit_rate)
    assert outputs[True][:2] == outputs[False][:2]
    assert outputs[True][2] > 0 and outputs[False][2] == 0


def test_dense_models_route_nothing():
    engine = LLMEngine(EngineConfig(model="synthetic:tiny", device="cpu", kv_cache_memory=1 << 22))
    engine.generate([[1, 2, 3]], SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True))
    assert engine.expert_stats is None
    assert all(
        r.experts_touched == () and r.expert_load_max_over_mean is None for r in engine.step_records
    )


def test_bfloat16_one_row_and_many_row_experts_agree_with_float32():
    """In 16 bits (where small matmuls take other kernels) experts with one row and with
    several route as in float32 and agree within bfloat16 rounding."""
    config = _random_moe_config(0, "softmax", True)
    weights = _random_moe_weights(config, seed=3)
    x = torch.randn(5, config.hidden_size, generator=torch.Generator().manual_seed(4))
    out32, routing = MoEMLP.build(config, weights, "mlp.", Linear.build)(x, torch.zeros_like(x))
    assert 1 in routing.tokens_per_expert and max(routing.tokens_per_expert) > 1
    bf16 = {name: w.to(torch.bfloat16) for name, w in weights.items()}
    moe16 = MoEMLP.build(config, bf16, "mlp.", Linear.build)
    x16 = x.to(torch.bfloat16)
    out16, routing16 = moe16(x16, torch.zeros_like(x16))
    assert routing16.expert_ids.tolist() == routing.expert_ids.tolist()
    assert torch.allclose(out16.float(), out32, atol=0.1 * out32.abs().max().item())
