"""The engine's transformer against `transformers` on tiny random checkpoints, in float32."""

from __future__ import annotations

import pytest
import torch

from llmbench.engine.engine import EngineConfig, LLMEngine
from llmbench.engine.hf_folder import HFFolderSource
from llmbench.engine.model import LlamaModel
from llmbench.engine.paged_attention import Chunk, KVCache, build_attention_batch
from llmbench.engine.sampling import SamplingParams
from tests.engine.helpers import VOCAB, write_tiny_checkpoint

NUM_DECODE_STEPS = 20
VARIANTS = {
    "llama-untied": dict(arch="llama"),
    "llama-tied": dict(arch="llama", tied=True),
    "llama3-rope": dict(arch="llama", llama3_rope=True),
    "qwen2-bias": dict(arch="qwen2"),
}


def _hf_greedy(folder, prompt: list[int]) -> tuple[list[int], list[torch.Tensor]]:
    """transformers' greedy tokens and the logits each one was chosen from."""
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    out = hf.generate(
        torch.tensor([prompt]),
        max_new_tokens=NUM_DECODE_STEPS + 1,
        do_sample=False,
        output_logits=True,
        return_dict_in_generate=True,
        eos_token_id=None,
        pad_token_id=0,
    )
    return out.sequences[0, len(prompt) :].tolist(), [s[0] for s in out.logits]


def _our_logits(folder, prompt: list[int], tokens: list[int], block_size: int):
    """Prefill `prompt`, then decode feeding `tokens`; the logits of every step."""
    source = HFFolderSource(folder)
    model = LlamaModel(source.config, source.load(torch.float32, torch.device("cpu")))
    cfg = source.config
    num_blocks = 64
    cache = KVCache(
        cfg.num_layers,
        num_blocks,
        block_size,
        cfg.num_kv_heads,
        cfg.head_dim,
        torch.float32,
        torch.device("cpu"),
    )
    # A scrambled block table: pages need not be contiguous or ordered.
    table = list(reversed(range(num_blocks)))[: -(-(len(prompt) + len(tokens)) // block_size)]

    def run(ids: list[int], start: int) -> torch.Tensor:
        end = start + len(ids)
        batch = build_attention_batch(
            [Chunk(start, len(ids), table)], block_size, cache.kv.device, torch.float32
        )
        hidden = model.forward(torch.tensor(ids), torch.arange(start, end), batch, cache)
        return model.compute_logits(hidden[-1:])[0]

    logits = [run(prompt, 0)]
    for i, token in enumerate(tokens[:-1]):
        logits.append(run([token], len(prompt) + i))
    return logits


@pytest.mark.parametrize("variant", VARIANTS)
def test_prefill_and_decode_logits_match_transformers(tmp_path, variant):
    folder = write_tiny_checkpoint(tmp_path, **VARIANTS[variant])
    prompt = torch.randint(0, VOCAB, (37,), generator=torch.Generator().manual_seed(1)).tolist()
    hf_tokens, hf_logits = _hf_greedy(folder, prompt)
    ours = _our_logits(folder, prompt, hf_tokens, block_size=16)
    assert len(ours) == len(hf_logits) == NUM_DECODE_STEPS + 1
    for step, (a, b) in enumerate(zip(ours, hf_logits, strict=True)):
        diff = (a - b).abs().max().item()
        assert diff < 1e-4, f"step {step}: max abs logit diff {diff}"


@pytest.mark.parametrize("variant", ["llama-untied", "llama-tied"])
def test_engine_greedy_tokens_match_transformers(tmp_path, variant):
    folder = write_tiny_checkpoint(tmp_path, **VARIANTS[variant])
    prompts = [
        torch.randint(0, VOCAB, (n,), generator=torch.Generator().manual_seed(n)).tolist()
        for n in (5, 16, 33)
    ]
    engine = LLMEngine(EngineConfig(model=str(folder), device="cpu", kv_cache_memory=1 << 22))
    params = SamplingParams(max_tokens=NUM_DECODE_STEPS, temperature=0.0, ignore_eos=True)
    ours = engine.generate(prompts, params)
    for prompt, tokens in zip(prompts, ours, strict=True):
        hf_tokens, _ = _hf_greedy(folder, prompt)
        assert tokens == hf_tokens[:NUM_DECODE_STEPS]


@pytest.mark.parametrize("prompt_len", [1, 15, 16, 17, 64, 65])
def test_block_size_does_not_change_results(tmp_path, prompt_len):
    """Block sizes 1, 16, 64 give identical outputs, incl. prompts ending on a block edge."""
    folder = write_tiny_checkpoint(tmp_path)
    prompt = torch.randint(0, VOCAB, (prompt_len,), generator=torch.Generator().manual_seed(7))
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    outputs = []
    for block_size in (1, 16, 64):
        engine = LLMEngine(
            EngineConfig(
                model=str(folder), device="cpu", block_size=block_size, kv_cache_memory=1 << 22
            )
        )
        outputs.append(engine.generate([prompt.tolist()], params)[0])
    assert outputs[0] == outputs[1] == outputs[2]
    assert len(outputs[0]) == 12
