"""Micro-benchmarks of the hot pieces, with pytest-benchmark (not part of the default `pytest`).

    pytest benchmarks/ --benchmark-only
    pytest benchmarks/ --benchmark-only --benchmark-autosave               # keep a baseline
    pytest benchmarks/ --benchmark-only --benchmark-compare --benchmark-compare-fail=mean:10%

Shapes are the default model's (smollm2-135m: hidden 576, 30 layers, 9 heads / 3 KV heads of 64,
vocabulary 49,152) with synthetic weights, so nothing is downloaded.
"""

from __future__ import annotations

import random

import pytest
import torch

from llmbench.engine.engine import EngineConfig, LLMEngine
from llmbench.engine.paged_attention import Chunk, KVCache, build_attention_batch, paged_attention
from llmbench.engine.presets import PRESETS
from llmbench.engine.records import StepRecord
from llmbench.engine.sampling import SamplingParams, make_generator, sample
from llmbench.harness import metrics
from llmbench.harness.records import RequestRecord
from llmbench.roofline import analysis

SMOLLM2 = PRESETS["smollm2-135m"]


def test_cost_model_over_10k_steps(benchmark):
    """A 10k-step run costed: 8 decoding sequences per step at contexts around 1k."""
    steps = [
        StepRecord(
            t_start_ns=i * 1_000_000,
            t_end_ns=i * 1_000_000 + 900_000,
            num_prefill_tokens=0,
            num_decode_seqs=8,
            context_lens=tuple(1000 + i % 100 + s for s in range(8)),
            query_lens=(1,) * 8,
            num_cached_tokens=0,
            num_blocks_used=500,
            num_blocks_total=1000,
            num_preempted=0,
            num_waiting=0,
        )
        for i in range(10_000)
    ]
    points = benchmark(analysis.cost_steps, SMOLLM2, steps, 2, 2)
    assert len(points) == 10_000


def test_metrics_over_100k_requests(benchmark):
    """The summary of 100k requests of 16 output tokens, one token per chunk."""
    rng = random.Random(0)
    records = []
    for i in range(100_000):
        sent = i * 1_000_000
        first = sent + rng.randint(20_000_000, 80_000_000)
        chunks = [first + k * rng.randint(9_000_000, 11_000_000) for k in range(16)]
        records.append(
            RequestRecord(
                request_id=f"r{i}",
                session_id=f"s{i}",
                turn=0,
                scheduled_ns=sent,
                sent_ns=sent,
                end_ns=chunks[-1],
                chunk_ns=sorted(chunks),
                chunk_tokens=[1] * 16,
                num_prompt_tokens=256,
            )
        )
    summary = benchmark(metrics.summarize, records, {"ttft_ms": 100.0})
    assert summary["num_completed"] == 100_000


def test_sampling_over_the_smollm2_vocabulary(benchmark):
    """8 rows of 49,152 logits, temperature 0.8 with top-p 0.9 and top-k 50, seeded."""
    logits = torch.randn(8, SMOLLM2.vocab_size, generator=torch.Generator().manual_seed(0))
    params = [SamplingParams(temperature=0.8, top_p=0.9, top_k=50, seed=i) for i in range(8)]
    generators = [make_generator(p.seed) for p in params]
    tokens = benchmark(sample, logits, params, generators)
    assert tokens.shape == (8,)


def test_paged_attention_decode_over_a_1k_context(benchmark):
    """One layer's decode attention for one sequence at context 1,024 (blocks of 16)."""
    cfg, block_size, context = SMOLLM2, 16, 1024
    cache = KVCache(1, context // block_size, block_size, cfg.num_kv_heads, cfg.head_dim,
                    torch.float32, torch.device("cpu"))  # fmt: skip
    cache.kv.normal_()
    block_table = list(range(context // block_size))[::-1]  # not contiguous, as in a real run
    batch = build_attention_batch(
        [Chunk(context - 1, 1, block_table)], block_size, torch.device("cpu"), torch.float32
    )
    q = torch.randn(1, cfg.num_heads, cfg.head_dim)
    kv = torch.randn(1, 2, cfg.num_kv_heads, cfg.head_dim)
    out = benchmark(paged_attention, q, kv, cache.layer(0), batch, cfg.head_dim**-0.5)
    assert out.shape == (1, cfg.num_heads, cfg.head_dim)


@pytest.fixture(scope="module")
def engine() -> LLMEngine:
    return LLMEngine(
        EngineConfig(
            model="synthetic:smollm2-135m",
            device="cpu",
            kv_cache_memory=256 * 2**20,
            max_num_batched_tokens=512,
            enable_prefix_caching=False,
        )
    )


def test_one_decode_step(benchmark, engine):
    """A single stream's decode step (the whole model once, one token)."""
    engine.add_request(list(range(100, 132)), SamplingParams(max_tokens=3000, ignore_eos=True))
    engine.step()  # the prefill
    outputs = benchmark.pedantic(engine.step, rounds=30, warmup_rounds=3)
    assert len(outputs) == 1 and len(outputs[0].new_token_ids) == 1
    engine.abort(outputs[0].request_id)
    engine.step()


def test_one_512_token_prefill_chunk(benchmark, engine):
    """A 512-token prompt prefilled in one step (prefix caching off: computed every round)."""
    params = SamplingParams(max_tokens=1, ignore_eos=True)

    def add_prompt():
        engine.add_request(list(range(1000, 1512)), params)
        return (), {}

    outputs = benchmark.pedantic(engine.step, setup=add_prompt, rounds=5, warmup_rounds=1)
    assert outputs[0].finished and outputs[0].num_prompt_tokens == 512
