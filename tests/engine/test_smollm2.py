"""The real SmolLM2-135M-Instruct GGUF: llmbench and `transformers` give the same greedy text."""

from __future__ import annotations

import pytest
import torch

from llmbench.engine.engine import EngineConfig, LLMEngine
from llmbench.engine.sampling import SamplingParams

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


def test_batched_generation_equals_one_at_a_time(engine):
    prompts = [engine.tokenizer.encode_chat([{"role": "user", "content": p}]) for p in PROMPTS]
    params = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
    together = engine.generate(prompts, params)
    alone = [engine.generate([p], params)[0] for p in prompts]
    assert together == alone
