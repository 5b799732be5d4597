"""Builders shared by tests: tiny random HF checkpoints, a tool definition, injected faults."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from tokenizers import Tokenizer, models, pre_tokenizers

VOCAB = 300


def write_tokenizer(folder: Path) -> None:
    """A word-level tokenizer over VOCAB made-up words plus ChatML specials."""
    vocab = {f"w{i}": i for i in range(VOCAB - 3)}
    vocab.update({"<|endoftext|>": VOCAB - 3, "<|im_start|>": VOCAB - 2, "<|im_end|>": VOCAB - 1})
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<|endoftext|>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|im_end|>"}))


def write_tiny_checkpoint(
    folder: Path,
    arch: str = "llama",
    tied: bool = False,
    llama3_rope: bool = False,
    seed: int = 0,
    hidden_size: int = 64,
) -> Path:
    """Save a 2-layer random-weight HF model (hidden 64 unless told, 4 heads, 2 kv heads) to
    folder."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    common = dict(
        vocab_size=VOCAB,
        hidden_size=hidden_size,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=tied,
        rms_norm_eps=1e-5,
    )
    torch.manual_seed(seed)
    if arch == "qwen2":
        model = Qwen2ForCausalLM(Qwen2Config(**common, rope_theta=10000.0))
    else:
        rope = {"rope_type": "default", "rope_theta": 10000.0}
        if llama3_rope:
            rope = {
                "rope_type": "llama3",
                "rope_theta": 500000.0,
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64,
            }
        model = LlamaForCausalLM(LlamaConfig(**common, rope_parameters=rope))
    # HF initialises with std 0.02; scale up so logits are far from uniform and argmax is stable.
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(5.0)
    model.save_pretrained(folder, safe_serialization=True)
    write_tokenizer(folder)
    return folder


def run_together(engine, prompts, params) -> list[tuple[list[int], str, str | None]]:
    """Every request's (tokens, text, finish reason), all of them in flight together."""
    ids = [engine.add_request(p, sp) for p, sp in zip(prompts, params, strict=True)]
    got = {i: ([], "", None) for i in ids}
    while engine.has_unfinished():
        for out in engine.step():
            tokens, text, _ = got[out.request_id]
            got[out.request_id] = (
                tokens + list(out.new_token_ids),
                text + out.new_text,
                out.finish_reason,
            )
    return [got[i] for i in ids]


def run_staggered(engine, prompts, params, arrive_every: int) -> dict[str, list[int]]:
    """Add one prompt every `arrive_every` steps while stepping; collect tokens per request."""
    tokens: dict[str, list[int]] = {}
    pending = list(prompts)
    step = 0
    while pending or engine.has_unfinished():
        if pending and step % arrive_every == 0:
            tokens[engine.add_request(pending.pop(0), params)] = []
        for out in engine.step():
            tokens[out.request_id] += out.new_token_ids
        step += 1
    return tokens


# An OpenAI function tool, as agent clients send it.
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Today's weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}


def crash_after(num_calls: int, target, error: Exception):
    """`target` that works `num_calls` times, then raises `error` (an injected engine fault)."""
    calls = {"n": 0}

    def wrapped(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] > num_calls:
            raise error
        return target(*args, **kwargs)

    return wrapped
