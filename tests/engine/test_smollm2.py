"""The real SmolLM2-135M-Instruct GGUF: llmbench and `transformers` give the same greedy text."""

from __future__ import annotations

import pytest
import torch

from llmbench.engine.engine import EngineConfig, LLMEngine
from llmbench.engine.sampling import SamplingParams
from tests.engine.helpers import run_staggered

pytestmark = pytest.mark.slow

PROMPTS = [
    "What is the capital of France?",
    "Write a Python function that reverses a string.",
    "Explain in two sentences why the sky is blue.",
]
NUM_TOKENS = 32


@pytest.fixture(scope="module")
def hf_model(smollm2_gguf_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = smollm2_gguf_path.parent, smollm2_gguf_path.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    return tokenizer, model


@pytest.fixture(scope="module")
def engine(smollm2_gguf_path):
    return LLMEngine(EngineConfig(model=str(smollm2_gguf_path), device="cpu"))


@torch.inference_mode()
def _hf_greedy(model, input_ids: torch.Tensor, num_tokens: int) -> list[int]:
    """Argmax decoding with transformers' own KV cache, past EOS (what ignore_eos does)."""
    out = model(input_ids, use_cache=True)
    tokens = []
    for _ in range(num_tokens):
        token = out.logits[0, -1].argmax().item()
        tokens.append(token)
        out = model(torch.tensor([[token]]), past_key_values=out.past_key_values, use_cache=True)
    return tokens


def test_greedy_chat_matches_transformers(hf_model, engine):
    hf_tokenizer, model = hf_model
    params = SamplingParams(max_tokens=NUM_TOKENS, temperature=0.0, ignore_eos=True)
    for prompt in PROMPTS:
        messages = [{"role": "user", "content": prompt}]
        ours_prompt = engine.tokenizer.encode_chat(messages)
        ref = hf_tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, return_dict=True, return_tensors="pt"
        )
        assert ours_prompt == ref["input_ids"][0].tolist()
        expected = _hf_greedy(model, ref["input_ids"], NUM_TOKENS)
        assert engine.generate([ours_prompt], params)[0] == expected, prompt


def test_continuous_batching_matches_one_at_a_time(smollm2_gguf_path, engine):
    """16 chat requests arriving over time, chunked prefill, a cache small enough to preempt."""
    topics = [
        "rivers",
        "owls",
        "prime numbers",
        "bread",
        "volcanoes",
        "chess",
        "tea",
        "comets",
        "bees",
        "glaciers",
        "jazz",
        "maps",
        "salt",
        "bridges",
        "coral",
        "clocks",
    ]
    prompts = [
        engine.tokenizer.encode_chat(
            [{"role": "user", "content": f"Tell me about {t}." * (i % 3 + 1)}]
        )
        for i, t in enumerate(topics)
    ]
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    alone = [engine.generate([p], params)[0] for p in prompts]
    kv_bytes_per_block = 2 * 30 * 192 * 4 * 16  # K+V x layers x kv_size x float32 x block_size
    batched = LLMEngine(
        EngineConfig(
            model=str(smollm2_gguf_path),
            device="cpu",
            block_size=16,
            max_num_batched_tokens=96,
            kv_cache_memory=10 * kv_bytes_per_block,
        )
    )
    together = run_staggered(batched, prompts, params, arrive_every=1)
    assert sum(r.num_preempted for r in batched.step_records) > 0
    assert list(together.values()) == alone
