"""Shared by the serve tests: a server on a free port in a thread, and a tiny real model whose
weights are set by hand so that greedy decoding writes known replies, a tool call among them.

The tool model is a one-layer Llama (hidden 64, word-level vocabulary of 32) run by the real
engine: KV cache, attention, sampler, detokenizer. Its embeddings are one-hot; the lm_head maps
each token to the next one of a chain, so what it writes depends on the last token and on one
attention feature:

- q and k are zero, so attention averages the values of every earlier position; the values
  read only the `<tool_response>` token, so the attention output at any position is
  c = (number of `<tool_response>` tokens so far) / (position + 1) on a spare hidden dim;
- after "assistant" (the end of every generation prompt), "Checking." scores `_SMALL` and
  "Sunny," scores `_TOOL_FEATURE` * c: with no tool result in the conversation (c = 0) the
  reply is `Checking. <tool_call> {json} </tool_call>`, after one it is `Sunny, 22C in Paris.`;
- every later link of a chain scores `_LARGE`, far above `_TOOL_FEATURE` * c for any c the
  tests reach, and each chain ends in `<|im_end|>`, the EOS.

So the model output is canned, and everything between it and the client is real.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import queue
import threading
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors.torch import save_file
from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers

from llmbench.engine.engine import EngineConfig, LLMEngine
from llmbench.serve import ServeConfig, run_server

CALL_JSON = '{"name":"get_weather","arguments":{"city":"Paris"}}'
WORDS = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>",  # 0-2: specials (0 is also <unk>)
    "system", "user", "assistant", "tool",  # 3-6: roles
    "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>",  # 7-10
    "Checking.", CALL_JSON, "Sunny,", "22C", "in", "Paris.",  # 11-16: the replies
]  # fmt: skip
WORDS += [f"w{i}" for i in range(len(WORDS), 32)]
ID = {word: i for i, word in enumerate(WORDS)}
TOOL_CALL_REPLY = f"Checking. <tool_call> {CALL_JSON} </tool_call>"
ANSWER_REPLY = "Sunny, 22C in Paris."
CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
_HIDDEN, _TOOL_DIM = 64, 63
_SMALL, _LARGE, _TOOL_FEATURE = 3.0, 1e4, 1e4
_CHAINS = [
    ["assistant", "Checking.", "<tool_call>", CALL_JSON, "</tool_call>", "<|im_end|>"],
    ["Sunny,", "22C", "in", "Paris.", "<|im_end|>"],
]


def write_tool_model(folder: Path) -> Path:
    """Save the model described above as a Hugging Face folder (ChatML template)."""
    folder.mkdir(parents=True, exist_ok=True)
    vocab_size = len(WORDS)
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": vocab_size,
        "hidden_size": _HIDDEN,
        "intermediate_size": 128,
        "num_hidden_layers": 1,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "max_position_embeddings": 512,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
    }
    (folder / "config.json").write_text(json.dumps(config))
    zeros = torch.zeros
    layer = "model.layers.0."
    v_proj, o_proj = zeros(32, _HIDDEN), zeros(_HIDDEN, _HIDDEN)
    # Input RMSNorm turns a one-hot embedding into sqrt(64) = 8 on its dim: v = 8 on the marker.
    v_proj[0, ID["<tool_response>"]] = 1.0
    o_proj[_TOOL_DIM, 0] = 1 / 8  # kv head 0 feeds query head 0, whose output dim 0 is input 0
    lm_head = zeros(vocab_size, _HIDDEN)
    for chain in _CHAINS:
        for here, after in itertools.pairwise(chain):
            lm_head[ID[after], ID[here]] = _SMALL if here == "assistant" else _LARGE
    lm_head[ID["Sunny,"], _TOOL_DIM] = _TOOL_FEATURE
    tensors = {
        "model.embed_tokens.weight": torch.eye(vocab_size, _HIDDEN),
        layer + "input_layernorm.weight": torch.ones(_HIDDEN),
        layer + "post_attention_layernorm.weight": torch.ones(_HIDDEN),
        layer + "self_attn.q_proj.weight": zeros(_HIDDEN, _HIDDEN),
        layer + "self_attn.k_proj.weight": zeros(32, _HIDDEN),
        layer + "self_attn.v_proj.weight": v_proj,
        layer + "self_attn.o_proj.weight": o_proj,
        layer + "mlp.gate_proj.weight": zeros(128, _HIDDEN),
        layer + "mlp.up_proj.weight": zeros(128, _HIDDEN),
        layer + "mlp.down_proj.weight": zeros(_HIDDEN, 128),
        "model.norm.weight": torch.ones(_HIDDEN),
        "lm_head.weight": lm_head,
    }
    save_file(tensors, str(folder / "model.safetensors"))

    tokenizer = Tokenizer(models.WordLevel(ID, unk_token="<|endoftext|>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.add_special_tokens([AddedToken(w, normalized=False) for w in WORDS[:3]])
    tokenizer.add_tokens([AddedToken(w, normalized=False, special=False) for w in WORDS[7:11]])
    tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|im_end|>"}))
    (folder / "chat_template.jinja").write_text(CHATML)
    return folder


def tiny_engine(model: str = "synthetic:tiny", kv_cache_bytes: int = 1 << 22) -> LLMEngine:
    return LLMEngine(EngineConfig(model=model, device="cpu", kv_cache_memory=kv_cache_bytes))


@contextlib.contextmanager
def serving(engine: LLMEngine, config: ServeConfig) -> Iterator[str]:
    """Run `llmbench serve`'s server over `engine` on 127.0.0.1 in a thread; yields its URL."""
    stop = threading.Event()
    ready: queue.Queue[int | BaseException] = queue.Queue()

    def serve() -> None:
        try:
            run_server(engine, config, port=0, on_ready=ready.put, stop=stop)
        except BaseException as e:  # surfaced to the caller instead of a 60 s wait
            ready.put(e)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    port = ready.get(timeout=60)
    if isinstance(port, BaseException):
        raise port
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        stop.set()
        thread.join(timeout=30)
        assert not thread.is_alive(), "the server did not stop"
