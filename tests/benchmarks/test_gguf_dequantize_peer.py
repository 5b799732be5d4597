"""llama.cpp runs the F32 and F16 copies that benchmarks/gguf_dequantize.py writes of the real
SmolLM2 Q4_1 file, and decodes greedily the same tokens as llmbench's float32 engine on the
Q4_1 file's dequantised values.

Left out of the default run (marked `peer`): it needs llama-cpp-python, in the interpreter
named by `LLMBENCH_LLAMA_CPP_PYTHON` (else the one running pytest):

    LLMBENCH_LLAMA_CPP_PYTHON=/path/to/venv/bin/python python -m pytest -m peer tests/benchmarks
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from benchmarks.gguf_dequantize import write_dequantized
from llmbench.engine.engine import EngineConfig, LLMEngine
from llmbench.engine.sampling import SamplingParams

pytestmark = [pytest.mark.peer, pytest.mark.slow]

NUM_TOKENS = 16
PROMPT = [{"role": "user", "content": "Write a long story about a lighthouse keeper."}]
GREEDY = r"""
import itertools, json, sys
from llama_cpp import Llama
llm = Llama(model_path=sys.argv[1], n_threads=2, n_ctx=512, verbose=False)
tokens = llm.generate(json.loads(sys.argv[2]), top_k=1, temp=0.0)
print(json.dumps([int(t) for t in itertools.islice(tokens, int(sys.argv[3]))]))
"""


def llama_cpp_greedy(model: str, prompt_ids: list[int]) -> list[int]:
    python = os.environ.get("LLMBENCH_LLAMA_CPP_PYTHON") or sys.executable
    done = subprocess.run(
        [python, "-c", GREEDY, model, json.dumps(prompt_ids), str(NUM_TOKENS)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        pytest.fail(f"{python}: llama.cpp failed on {model}:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout)


def test_llama_cpp_decodes_the_f32_and_f16_copies_like_llmbench_float32(
    smollm2_gguf_path, tmp_path
):
    engine = LLMEngine(EngineConfig(dtype="float32", device="cpu", max_num_seqs=1))
    prompt_ids = engine.tokenizer.encode_chat(PROMPT)
    params = SamplingParams(max_tokens=NUM_TOKENS, temperature=0.0, ignore_eos=True)
    ours = [t for out in engine.stream(prompt_ids, params) for t in out.new_token_ids]
    assert len(ours) == NUM_TOKENS
    for out_type in ("F32", "F16"):
        copy = tmp_path / f"smollm2.{out_type}.gguf"
        write_dequantized(smollm2_gguf_path, copy, out_type)
        assert llama_cpp_greedy(str(copy), prompt_ids) == ours, out_type
