"""The real SmolLM2-135M-Instruct: speculative decoding (n-gram, and an int8 copy of itself as
the draft) gives exactly plain greedy decoding's tokens, for concurrent requests of different
lengths with stops."""

from __future__ import annotations

import pytest

from llmbench.engine.engine import EngineConfig, LLMEngine
from llmbench.engine.sampling import SamplingParams
from llmbench.engine.speculative import SpeculativeConfig
from tests.engine.helpers import run_together

pytestmark = pytest.mark.slow

PROMPTS = [
    "Repeat this list exactly, twice: apples, pears, plums, figs, dates, limes.",
    "What is the capital of France?",
    "Copy the sentence 'The quick brown fox jumps over the lazy dog' three times.",
    "Write a Python function that adds two numbers, then call it with 2 and 3.",
]


@pytest.fixture(scope="module")
def plain_engine(smollm2_gguf_path):
    return LLMEngine(EngineConfig(model=str(smollm2_gguf_path), device="cpu"))


@pytest.mark.parametrize(
    "spec",
    [
        SpeculativeConfig(method="ngram", num_tokens=4, ngram_min=2, ngram_max=4),
        SpeculativeConfig(method="draft", num_tokens=3, draft_model="self:quantize=int8"),
    ],
    ids=["ngram", "draft"],
)
def test_speculative_greedy_decoding_matches_plain_decoding(smollm2_gguf_path, plain_engine, spec):
    tokenizer = plain_engine.tokenizer
    prompts = [tokenizer.encode_chat([{"role": "user", "content": p}]) for p in PROMPTS]
    greedy = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    plain = plain_engine.generate(prompts, greedy)
    # Stops that fire mid-reply: a token of reply 0, the text of a token of reply 2, a short
    # max_tokens, and EOS for reply 1 (a short answer).
    params = [
        SamplingParams(max_tokens=24, temperature=0.0, stop_token_ids=(plain[0][11],)),
        SamplingParams(max_tokens=24, temperature=0.0),
        SamplingParams(max_tokens=24, temperature=0.0, stop=(tokenizer.decode([plain[2][15]]),)),
        SamplingParams(max_tokens=9, temperature=0.0, ignore_eos=True),
    ]
    expected = run_together(plain_engine, prompts, params)
    engine = LLMEngine(
        EngineConfig(
            model=str(smollm2_gguf_path), device="cpu", speculative=spec, max_num_batched_tokens=64
        )
    )
    assert run_together(engine, prompts, params) == expected
    records = engine.step_records
    assert sum(r.num_accepted_tokens for r in records) > 0
    assert [out[2] for out in expected] == ["stop", "stop", "stop", "length"]
