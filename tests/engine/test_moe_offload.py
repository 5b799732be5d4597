"""Expert offloading: the LRU and the link bytes of hand-built routings against a hand count,
resident experts from a usage profile, and outputs identical with and without offloading."""

from __future__ import annotations

import json
import time

import pytest
import torch

from llmbench.engine.engine import EngineConfig, LLMEngine
from llmbench.engine.linear import Linear
from llmbench.engine.moe import MoEMLP
from llmbench.engine.moe_offload import (
    ExpertLRU,
    LinkMeter,
    MoEOffloadConfig,
    OffloadedExperts,
    read_usage_profile,
    resident_experts,
)
from llmbench.engine.sampling import SamplingParams
from llmbench.errors import UserError

TINY_MOE = "synthetic:tiny-moe"  # 2 layers, 8 experts of width 32 over hidden 64, top-2


def test_lru_fetches_what_is_neither_resident_nor_cached():
    lru = ExpertLRU(frozenset({0, 1}), capacity=1)
    # step 1: 0 resident, 2 and 3 fetched; the cache keeps the last one used (3).
    assert lru.touch([0, 2, 3]) == [2, 3]
    assert list(lru.cached) == [3]
    # step 2: 3 is a hit, 2 was evicted: fetched again; 3 is used after 2, so 3 stays.
    assert lru.touch([2, 3]) == [2]
    assert list(lru.cached) == [3]
    assert lru.touch([1, 3]) == []  # resident and cached: nothing crosses the link
    assert lru.touch([4]) == [4]
    assert list(lru.cached) == [4]


def test_lru_of_zero_fetches_every_non_resident_expert_every_time():
    lru = ExpertLRU(frozenset({0}), capacity=0)
    assert lru.touch([0, 1]) == [1]
    assert lru.touch([0, 1]) == [1]
    assert not lru.cached


def _experts(num_experts: int, hidden: int = 4, width: int = 3, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    gate_up = tuple(Linear(torch.randn(2 * width, hidden, generator=g)) for _ in range(num_experts))
    down = tuple(Linear(torch.randn(hidden, width, generator=g)) for _ in range(num_experts))
    return gate_up, down


def test_link_bytes_of_a_hand_built_sequence_of_routings():
    gate_up, down = _experts(6)  # an expert: [6, 4] + [4, 3] float32 = 96 + 48 = 144 bytes
    link = LinkMeter(bytes_per_s=1e6, sleep=False)
    fetch = OffloadedExperts(gate_up, down, ExpertLRU(frozenset({0, 1}), 2), link, None)
    assert fetch.expert_bytes == 144
    steps = [
        (1, 0, 1, 1, 0, 0),  # touches 0, 2, 3: misses 2, 3 → cache [2, 3]
        (0, 1, 1, 0, 1, 0),  # 1, 2, 4: miss 4 → cache [2, 4] (3 evicted)
        (0, 0, 0, 1, 0, 0),  # 3: miss → cache [4, 3]
        (1, 1, 0, 0, 1, 0),  # 0, 1, 4: all hits
    ]
    per_step = []
    for tokens_per_expert in steps:
        fetch(tokens_per_expert)
        per_step.append(link.take())
    assert [b for b, _ in per_step] == [2 * 144, 144, 144, 0]
    assert [s for _, s in per_step] == pytest.approx([288e-6, 144e-6, 144e-6, 0.0])


def test_sleep_makes_the_simulated_time_wall_time():
    link = LinkMeter(bytes_per_s=1e9, sleep=True)
    t0 = time.perf_counter()
    link.add(20_000_000)  # 20 ms at 1 GB/s
    assert time.perf_counter() - t0 >= 0.02
    assert link.take() == (20_000_000, pytest.approx(0.02))
    assert link.take() == (0, 0.0)


def _moe(fetch=None) -> MoEMLP:
    gate_up, down = _experts(4, hidden=8, width=5, seed=1)
    router = Linear(torch.randn(4, 8, generator=torch.Generator().manual_seed(2)))
    return MoEMLP(
        router,
        gate_up,
        down,
        top_k=2,
        scoring="softmax",
        normalize=True,
        expert_width=5,
        fetch=fetch,
    )


def test_real_copies_give_the_same_output_and_keep_only_the_lru():
    plain = _moe()
    link = LinkMeter(None, sleep=False)
    lru = ExpertLRU(frozenset({0}), capacity=1)
    fetch = OffloadedExperts(
        plain.expert_gate_up, plain.expert_down, lru, link, torch.device("cpu")
    )
    offloaded = _moe(fetch)
    x = torch.randn(5, 8, generator=torch.Generator().manual_seed(3))
    for _ in range(3):
        out, routing = plain(x, torch.zeros(5, 8))
        out_offloaded, _ = offloaded(x, torch.zeros(5, 8))
        assert torch.equal(out, out_offloaded)
        touched = [e for e, n in enumerate(routing.tokens_per_expert) if n]
        assert set(fetch.fetched) == set(lru.cached) <= set(touched) - {0}
    bytes_moved, seconds = link.take()
    assert bytes_moved > 0 and seconds == 0.0  # a real link: its time is the step's own


def test_offloading_changes_no_token_and_no_logit_only_link_bytes():
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    prompts = ["the quick brown fox", "jumps over the lazy dog and"]
    base = LLMEngine(EngineConfig(model=TINY_MOE, device="cpu", kv_cache_memory=2**22))
    offload = MoEOffloadConfig(num_resident=4, num_cached=1, link_bytes_per_s=32e9)
    moved = LLMEngine(
        EngineConfig(model=TINY_MOE, device="cpu", kv_cache_memory=2**22, moe_offload=offload)
    )
    assert moved.generate(prompts, params) == base.generate(prompts, params)
    ids = base.tokenizer.encode("a text to score, all of it")
    assert torch.equal(moved.score(ids), base.score(ids))
    steps = list(moved.step_records)
    expert_bytes = 3 * 64 * 32 * 4  # gate, up, down of one expert in float32
    assert moved.moe_offload.expert_bytes == expert_bytes
    assert sum(s.link_bytes for s in steps) > 0
    for s in steps:
        assert s.link_bytes % expert_bytes == 0
        assert s.link_s_simulated == pytest.approx(s.link_bytes / 32e9)
    assert all(s.link_bytes == 0 for s in base.step_records)


def test_every_expert_resident_moves_nothing():
    offload = MoEOffloadConfig(num_resident=8, link_bytes_per_s=32e9)
    engine = LLMEngine(
        EngineConfig(model=TINY_MOE, device="cpu", kv_cache_memory=2**22, moe_offload=offload)
    )
    engine.generate(["hello"], SamplingParams(max_tokens=4, ignore_eos=True))
    assert [s.link_bytes for s in engine.step_records] == [0, 0, 0, 0]


def test_resident_experts_are_the_most_routed_ties_to_the_lower_id():
    usage = [[5, 9, 9, 1], [0, 0, 3, 0]]
    assert resident_experts(usage, 2, 4, 2) == [frozenset({1, 2}), frozenset({0, 2})]
    assert resident_experts(None, 2, 4, 3) == [frozenset({0, 1, 2})] * 2


def test_usage_profile_sums_the_phases_of_an_experts_file(tmp_path):
    path = tmp_path / "experts.json"
    phases = {
        "prefill": {"tokens": [[1, 2], [3, 4]], "weight": [[0, 0], [0, 0]]},
        "decode": {"tokens": [[10, 0], [0, 1]], "weight": [[0, 0], [0, 0]]},
    }
    path.write_text(json.dumps({"num_layers": 2, "num_experts": 2, "top_k": 1, "phases": phases}))
    assert read_usage_profile(path, 2, 2) == [[11, 2], [3, 5]]
    with pytest.raises(UserError, match="not 3 layers x 2 experts"):
        read_usage_profile(path, 3, 2)
    path.write_text("{}")
    with pytest.raises(UserError, match="not an experts.json"):
        read_usage_profile(path, 2, 2)
    with pytest.raises(UserError, match="cannot read it"):
        read_usage_profile(tmp_path / "missing.json", 2, 2)


def test_usage_profile_picks_the_resident_experts_of_an_engine(tmp_path):
    tokens = [[0, 0, 0, 0, 0, 0, 7, 9], [9, 0, 0, 0, 0, 0, 0, 8]]
    path = tmp_path / "experts.json"
    path.write_text(json.dumps({"phases": {"decode": {"tokens": tokens}}}))
    offload = MoEOffloadConfig(2, link_bytes_per_s=1e9, usage_profile=str(path))
    engine = LLMEngine(
        EngineConfig(model=TINY_MOE, device="cpu", kv_cache_memory=2**22, moe_offload=offload)
    )
    assert engine.moe_offload.resident == [frozenset({6, 7}), frozenset({0, 7})]
    assert "most routed in" in engine.moe_offload.describe()


@pytest.mark.parametrize(
    ("model", "offload", "fragment"),
    [
        ("synthetic:tiny", MoEOffloadConfig(1, link_bytes_per_s=1e9), "dense"),
        (TINY_MOE, MoEOffloadConfig(9, link_bytes_per_s=1e9), "more than the model's 8"),
        (TINY_MOE, MoEOffloadConfig(4), "no host link"),
    ],
)
def test_impossible_offloads_are_user_errors(model, offload, fragment):
    with pytest.raises(UserError, match=fragment):
        LLMEngine(
            EngineConfig(model=model, device="cpu", kv_cache_memory=2**22, moe_offload=offload)
        )


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"num_resident": -1}, ">= 0"),
        ({"num_resident": 1, "link_bytes_per_s": 0.0}, "> 0 bytes/s"),
        ({"num_resident": 1, "sleep": True}, "sleep needs a simulated link"),
    ],
)
def test_bad_offload_configs_are_user_errors(kwargs, fragment):
    with pytest.raises(UserError, match=fragment):
        MoEOffloadConfig(**kwargs)
