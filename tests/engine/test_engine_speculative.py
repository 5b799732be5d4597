"""LLMEngine with speculative decoding: greedy outputs identical to plain decoding (n-gram and
draft models, concurrent requests of different lengths, stops), sampled outputs distributed as
plain sampling, and a cache left consistent by rejected drafts."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from llmbench.engine.engine import EngineConfig, LLMEngine
from llmbench.engine.sampling import SamplingParams
from llmbench.engine.speculative import SpeculativeConfig
from tests.engine.helpers import VOCAB, run_staggered, run_together, write_tiny_checkpoint

GREEDY = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    return str(write_tiny_checkpoint(tmp_path_factory.mktemp("tiny")))


@pytest.fixture(scope="module")
def draft_folder(tmp_path_factory, tiny_folder):
    """The target with noise on every matrix: a draft that agrees with it often, not always."""
    folder = tmp_path_factory.mktemp("draft")
    for file in Path(tiny_folder).iterdir():
        shutil.copy(file, folder / file.name)
    weights = load_file(folder / "model.safetensors")
    g = torch.Generator().manual_seed(1)
    for w in weights.values():
        if w.dim() == 2:
            w += 0.4 * w.std() * torch.randn(w.shape, generator=g)
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    return str(folder)


NO_SPECULATION = SpeculativeConfig()


def make_engine(model: str, spec: SpeculativeConfig = NO_SPECULATION, **kwargs) -> LLMEngine:
    config = dict(model=model, device="cpu", kv_cache_memory=1 << 22, speculative=spec)
    return LLMEngine(EngineConfig(**(config | kwargs)))


def prompts(num: int, seed: int = 0) -> list[list[int]]:
    """Prompts of 6 to 6 + 9·(num-1) tokens that repeat a motif, so n-gram lookup finds drafts."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(num):
        motif = torch.randint(0, VOCAB - 3, (3 + i % 4,), generator=g).tolist()
        noise = torch.randint(0, VOCAB - 3, (3 + 9 * i,), generator=g).tolist()
        out.append((motif + noise + motif)[: 6 + 9 * i])
    return out


def methods(draft_folder: str) -> dict[str, SpeculativeConfig]:
    return {
        "ngram": SpeculativeConfig(method="ngram", num_tokens=4, ngram_min=1, ngram_max=3),
        "draft-other": SpeculativeConfig(method="draft", num_tokens=3, draft_model=draft_folder),
        "draft-self": SpeculativeConfig(method="draft", num_tokens=4, draft_model="self:layers=1"),
    }


@pytest.mark.parametrize("method", ["ngram", "draft-other", "draft-self"])
def test_greedy_speculation_gives_the_tokens_of_plain_decoding(tiny_folder, draft_folder, method):
    """Eight requests of different lengths arriving over time, a token budget small enough to
    put verify rows beside prefill chunks, a cache small enough to preempt."""
    batch = prompts(8)
    plain = run_staggered(make_engine(tiny_folder), batch, GREEDY, arrive_every=2)
    kv_bytes_per_block = 2 * 2 * 32 * 4 * 16  # K+V x layers x kv_size x float32 x block_size
    engine = make_engine(
        tiny_folder,
        methods(draft_folder)[method],
        max_num_batched_tokens=24,
        kv_cache_memory=12 * kv_bytes_per_block,
    )
    fast = run_staggered(engine, batch, GREEDY, arrive_every=2)
    assert list(fast.values()) == list(plain.values())
    records = engine.step_records
    proposed = sum(r.num_proposed_tokens for r in records)
    accepted = sum(r.num_accepted_tokens for r in records)
    assert 0 < accepted < proposed, "drafts should be both accepted and rejected"
    assert sum(r.num_preempted for r in records) > 0
    assert any(r.num_verify_seqs and r.num_prefill_tokens for r in records), "no mixed step"
    assert max(r.num_prefill_tokens + sum(r.query_lens) for r in records) <= 2 * 24
    assert all(sum(r.query_lens) <= 24 for r in records)
    assert engine.blocks.num_free_blocks == engine.blocks.num_blocks
    assert len(records) < len(batch) * GREEDY.max_tokens  # fewer steps than tokens


def test_a_draft_that_is_the_target_is_always_accepted(tiny_folder):
    spec = SpeculativeConfig(method="draft", num_tokens=4, draft_model="self:layers=2")
    engine = make_engine(tiny_folder, spec)
    out = engine.generate(prompts(3), GREEDY)
    assert out == make_engine(tiny_folder).generate(prompts(3), GREEDY)
    records = engine.step_records
    assert sum(r.num_accepted_tokens for r in records) == sum(
        r.num_proposed_tokens for r in records
    )
    # Each verify step emits k + 1 tokens: 23 tokens after the first take ceil(23 / 5) = 5 steps.
    assert sum(1 for r in records if r.num_verify_seqs) == 5


def stop_params(plain_tokens: list[int], plain_text_of) -> list[SamplingParams]:
    """Stops that fire mid-reply in plain decoding: a stop token, a stop string, max_tokens."""
    return [
        SamplingParams(max_tokens=24, temperature=0.0, stop_token_ids=(plain_tokens[0][6],)),
        SamplingParams(max_tokens=24, temperature=0.0, stop=(plain_text_of(plain_tokens[1][9]),)),
        SamplingParams(max_tokens=7, temperature=0.0),
        SamplingParams(max_tokens=24, temperature=0.0),  # EOS if the model says it
    ]


@pytest.mark.parametrize("method", ["ngram", "draft-self"])
def test_stops_apply_to_accepted_tokens_in_order(tiny_folder, draft_folder, method):
    batch = prompts(4, seed=5)
    reference = make_engine(tiny_folder)
    plain_tokens = reference.generate(batch, GREEDY)
    params = stop_params(plain_tokens, lambda t: reference.tokenizer.decode([t]))

    expected = run_together(make_engine(tiny_folder), batch, params)
    assert [r[2] for r in expected[:3]] == ["stop", "stop", "length"]
    engine = make_engine(tiny_folder, methods(draft_folder)[method])
    assert run_together(engine, batch, params) == expected
    assert sum(r.num_accepted_tokens for r in engine.step_records) > 0


def test_rejected_drafts_leave_the_prefix_cache_consistent(tiny_folder, draft_folder):
    """A second request whose prompt is the first one's prompt and reply hits blocks filled
    during verify steps with rejections; it must get the tokens a cache-free engine gives."""
    spec = SpeculativeConfig(method="draft", num_tokens=4, draft_model=draft_folder)
    engine = make_engine(tiny_folder, spec, block_size=4)
    first = prompts(1, seed=7)[0]
    reply = engine.generate([first], GREEDY)[0]
    records = list(engine.step_records)
    assert sum(r.num_accepted_tokens for r in records) < sum(r.num_proposed_tokens for r in records)
    second = first + reply + [11, 12]
    rid = engine.add_request(second, GREEDY)
    got, cached = [], 0
    while engine.has_unfinished():
        for out in engine.step():
            assert out.request_id == rid
            got += out.new_token_ids
            cached = out.num_cached_tokens
    # Every full block of the first request's prompt and reply but the last token's is reused.
    assert cached == (len(first) + len(reply) - 1) // 4 * 4
    fresh = make_engine(tiny_folder, enable_prefix_caching=False)
    assert got == fresh.generate([second], GREEDY)[0]


def test_request_outputs_count_each_requests_drafts(tiny_folder):
    spec = SpeculativeConfig(method="ngram", num_tokens=4, ngram_min=1)
    engine = make_engine(tiny_folder, spec)
    rid = engine.add_request(prompts(3)[2], GREEDY)
    outputs = []
    while engine.has_unfinished():
        (out,) = engine.step()
        outputs.append(out)
    records = engine.step_records
    last = outputs[-1]
    assert last.request_id == rid and last.finished
    assert last.num_proposed_tokens == sum(r.num_proposed_tokens for r in records) > 0
    assert last.num_accepted_tokens == sum(r.num_accepted_tokens for r in records)
    # Each step after the prefill runs 1 + k rows and hands out the accepted drafts + 1 token.
    for out, record in list(zip(outputs, records, strict=True))[1:]:
        assert record.query_lens == (1 + record.num_proposed_tokens,)
        assert len(out.new_token_ids) == 1 + record.num_accepted_tokens


@pytest.mark.parametrize("method", ["ngram", "draft-other"])
def test_an_adaptive_budget_withholds_costly_drafts_in_decode_steps_only(
    tiny_folder, draft_folder, method
):
    """A budget taught that a draft row costs 1 s beside a 1 ms decode step keeps no draft in a
    step of decodes only (but every EXPLORE_EVERY-th), and every draft beside a prompt's
    chunk; greedy replies are still plain decoding's, sampled ones run (the drafts'
    probabilities cut with them)."""
    batch = prompts(6)
    plain = run_staggered(make_engine(tiny_folder), batch, GREEDY, arrive_every=3)
    spec = dataclasses.replace(methods(draft_folder)[method], adaptive=True)
    engine = make_engine(tiny_folder, spec)
    for num_seqs in range(1, 7):
        engine.draft_budget.observe_step(num_seqs, 0, 0.001)
        engine.draft_budget.observe_step(num_seqs, 1, 1.0)
    assert run_staggered(engine, batch, GREEDY, arrive_every=3) == plain
    records = list(engine.step_records)
    withheld = [r for r in records if r.num_withheld_tokens]
    assert withheld and all(r.num_proposed_tokens == r.num_prefill_tokens == 0 for r in withheld)
    assert any(r.num_verify_seqs and r.num_prefill_tokens for r in records), "no mixed step"
    assert any(r.num_verify_seqs and not r.num_prefill_tokens for r in records), "no relearning"
    sampled = SamplingParams(max_tokens=24, temperature=1.0, seed=3, ignore_eos=True)
    engine.generate(batch, sampled)
    assert engine.blocks.num_free_blocks == engine.blocks.num_blocks


def two_sample_chi_square(a: torch.Tensor, b: torch.Tensor) -> tuple[float, int]:
    """Homogeneity of two count vectors. Formula: Σ (√(Nb/Na)·a - √(Na/Nb)·b)² / (a + b) over
    cells with a + b > 0; degrees of freedom = those cells - 1."""
    keep = (a + b) > 0
    a, b = a[keep].double(), b[keep].double()
    na, nb = a.sum(), b.sum()
    stat = ((torch.sqrt(nb / na) * a - torch.sqrt(na / nb) * b) ** 2 / (a + b)).sum()
    return float(stat), int(keep.sum()) - 1


def first_two_tokens(engine: LLMEngine, prompt: list[int], seeds: range) -> torch.Tensor:
    """Counts of (token 1, token 2) over one request per seed, top-3 sampling: [V, V]."""
    params = [
        SamplingParams(max_tokens=3, temperature=1.0, top_k=3, seed=s, ignore_eos=True)
        for s in seeds
    ]
    counts = torch.zeros(VOCAB, VOCAB)
    for tokens in engine.generate([prompt] * len(seeds), params):
        counts[tokens[0], tokens[1]] += 1
    return counts


def test_sampled_speculation_keeps_the_output_distribution(tiny_folder, draft_folder):
    """Draft tokens drawn from the draft's own distribution (q), kept by the rejection rule:
    the pairs (token 1, token 2) come out as often as plain sampling makes them."""
    prompt = prompts(1, seed=11)[0]
    plain = first_two_tokens(make_engine(tiny_folder, max_num_seqs=256), prompt, range(1000))
    spec = SpeculativeConfig(method="draft", num_tokens=2, draft_model=draft_folder)
    engine = make_engine(tiny_folder, spec, max_num_seqs=256)
    fast = first_two_tokens(engine, prompt, range(10_000, 11_000))
    assert sum(r.num_proposed_tokens for r in engine.step_records) >= 1000
    stat, df = two_sample_chi_square(plain.flatten(), fast.flatten())
    assert df == 8  # 3 x 3 pairs
    assert stat < 26.12  # chi-square(8) 0.999 quantile
