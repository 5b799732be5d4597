"""Expert statistics against a routing counted by hand: identity routers force known choices."""

from __future__ import annotations

import json
import math

import torch

from llmbench.engine.config import ModelConfig
from llmbench.engine.engine import EngineConfig, LLMEngine
from llmbench.engine.expert_stats import ExpertStats
from llmbench.engine.linear import Linear
from llmbench.engine.moe import MoEMLP
from llmbench.engine.sampling import SamplingParams

CONFIG = ModelConfig(
    vocab_size=16,
    hidden_size=4,
    num_layers=2,
    num_heads=1,
    num_kv_heads=1,
    head_dim=4,
    intermediate_size=4,
    max_position_embeddings=64,
    num_experts=4,
    num_experts_per_tok=2,
    moe_intermediate_size=3,
    norm_topk_prob=True,
)
# Five tokens; with an identity router the logits are the rows themselves, and every row's
# best two are one apart, so each token gives sigmoid(1) to its first choice, 1 - that to the
# second: t0 {0, 1}, t1 {1, 2}, t2 {0, 2}, t3 {3, 2}, t4 {0, 1} (first choice first).
TOKENS = torch.tensor([[4.0, 3, 1, 0], [0, 4, 3, 1], [4, 0, 3, 1], [1, 0, 3, 4], [4, 3, 0, 1]])
# The step: a 3-token prefill chunk (t0-t2), then two decodes (t3, t4).
QUERY_LENS, IS_PREFILL = [3, 1, 1], [True, False, False]
FIRST = 1 / (1 + math.exp(-1.0))  # e^4 / (e^4 + e^3)
SECOND = 1 - FIRST


def _moe(router: torch.Tensor) -> MoEMLP:
    g = torch.Generator().manual_seed(0)
    weights = {"mlp.gate.weight": router}
    for e in range(CONFIG.num_experts):
        for name, shape in (("gate_proj", (3, 4)), ("up_proj", (3, 4)), ("down_proj", (4, 3))):
            weights[f"mlp.experts.{e}.{name}.weight"] = torch.randn(shape, generator=g)
    return MoEMLP.build(CONFIG, weights, "mlp.", Linear.build)


def _hand_built_step():
    identity = torch.eye(4)
    reversed_ = identity.flip(0)  # layer 1: expert e reads column 3 - e
    return [_moe(router)(TOKENS, torch.zeros_like(TOKENS))[1] for router in (identity, reversed_)]


def test_router_choices_are_the_hand_counted_ones():
    layer0, layer1 = _hand_built_step()
    assert layer0.expert_ids.tolist() == [[0, 1], [1, 2], [0, 2], [3, 2], [0, 1]]
    assert torch.allclose(layer0.weights, torch.tensor([[FIRST, SECOND]] * 5))
    assert layer0.tokens_per_expert == (3, 3, 3, 1)
    assert layer1.tokens_per_expert == (1, 3, 3, 3)
    assert layer0.num_experts_touched == 4
    assert layer0.load_max_over_mean == 3 / (5 * 2 / 4)


def _close(values: list[float], expected: list[float]) -> bool:
    """Equal up to float32 rounding (weights are computed in float32, summed in float64)."""
    return len(values) == len(expected) and all(
        math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-7)
        for a, b in zip(values, expected, strict=True)
    )


def test_statistics_equal_the_hand_counted_routing():
    stats = ExpertStats(2, 4, 2, torch.device("cpu"))
    stats.add_step(_hand_built_step(), QUERY_LENS, IS_PREFILL)
    d = stats.to_dict()
    assert (d["num_layers"], d["num_experts"], d["top_k"]) == (2, 4, 2)
    prefill, decode = d["phases"]["prefill"], d["phases"]["decode"]
    # Layer 0. Prefill t0 {0,1}, t1 {1,2}, t2 {0,2}; decode t3 {3,2}, t4 {0,1}.
    assert prefill["tokens"][0] == [2, 2, 2, 0]
    assert decode["tokens"][0] == [1, 1, 1, 1]
    assert _close(prefill["weight"][0], [2 * FIRST, FIRST + SECOND, 2 * SECOND, 0.0])
    assert _close(decode["weight"][0], [FIRST, SECOND, SECOND, FIRST])
    assert prefill["coactivation"][0] == [
        [2, 1, 1, 0],
        [1, 2, 1, 0],
        [1, 1, 2, 0],
        [0, 0, 0, 0],
    ]
    assert decode["coactivation"][0] == [
        [1, 1, 0, 0],
        [1, 1, 0, 0],
        [0, 0, 1, 1],
        [0, 0, 1, 1],
    ]
    # Layer 1 routes expert e where layer 0 routed 3 - e.
    assert prefill["tokens"][1] == [0, 2, 2, 2]
    assert decode["tokens"][1] == [1, 1, 1, 1]
    assert decode["coactivation"][1] == [
        [1, 1, 0, 0],
        [1, 1, 0, 0],
        [0, 0, 1, 1],
        [0, 0, 1, 1],
    ]
    json.dumps(d)  # plain JSON


def test_steps_accumulate_and_reset_forgets():
    stats = ExpertStats(2, 4, 2, torch.device("cpu"))
    step = _hand_built_step()
    stats.add_step(step, [5], [False])  # all five rows as decodes
    stats.add_step(step, [5], [False])
    d = stats.to_dict()["phases"]
    assert d["decode"]["tokens"][0] == [6, 6, 6, 2]
    assert d["decode"]["coactivation"][0][0][1] == 4  # t0 and t4, twice
    assert d["prefill"]["tokens"][0] == [0, 0, 0, 0]
    stats.reset()
    assert stats.to_dict()["phases"]["decode"]["tokens"] == [[0] * 4] * 2


def test_engine_counts_prompt_tokens_as_prefill_and_the_rest_as_decode():
    engine = LLMEngine(
        EngineConfig(model="synthetic:tiny-moe", device="cpu", kv_cache_memory=1 << 22)
    )
    params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    engine.generate([list(range(10, 15)), list(range(20, 29))], params)
    d = engine.expert_stats.to_dict()
    k = d["top_k"]
    assert (d["num_layers"], d["num_experts"], k) == (2, 8, 2)
    for layer in range(2):
        prefill, decode = d["phases"]["prefill"], d["phases"]["decode"]
        # 5 + 9 prompt tokens; the first output token comes with the prefill, each of the
        # other 3 of both requests from a decode step.
        assert sum(prefill["tokens"][layer]) == (5 + 9) * k
        assert sum(decode["tokens"][layer]) == 2 * 3 * k
        # Renormalised top-k weights sum to 1 per token.
        assert math.isclose(sum(prefill["weight"][layer]), 5 + 9, rel_tol=1e-6)
        for phase in (prefill, decode):
            coact = phase["coactivation"][layer]
            assert [coact[e][e] for e in range(8)] == phase["tokens"][layer]
            assert sum(map(sum, coact)) == sum(phase["tokens"][layer]) * k  # k² pairs per token
    touched = [r.experts_touched for r in engine.step_records]
    assert all(len(t) == 2 and all(1 <= n <= 8 for n in t) for t in touched)
    assert engine.step_records[-1].experts_touched[0] <= 2 * k  # two decode tokens
