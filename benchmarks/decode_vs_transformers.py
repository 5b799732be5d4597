"""Single-stream decode: llmbench's engine vs `transformers.generate`, same model, dtype, threads.

    python benchmarks/decode_vs_transformers.py --dtype float32 --dtype bfloat16

Both run in this process, one after the other, on the same prompt; each number is the median
of `--repeats` generations of `--tokens` tokens. Decode tok/s = (n - 1) / (t_last - t_first);
achieved GB/s = the bytes a decode step must read (weights + KV) / the measured step time.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from llmbench.engine import model_store
from llmbench.engine.engine import EngineConfig, LLMEngine
from llmbench.engine.sampling import SamplingParams
from llmbench.harness.generate_stats import decode_bytes_per_s, decode_tok_per_s

PROMPT = [{"role": "user", "content": "Write a long story about a lighthouse keeper."}]


def engine_decode(dtype: str, tokens: int, repeats: int) -> tuple[float, float]:
    engine = LLMEngine(EngineConfig(dtype=dtype, device="cpu", max_num_seqs=1))
    prompt = engine.tokenizer.encode_chat(PROMPT)
    params = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)
    rates, bandwidths = [], []
    for _ in range(repeats + 1):  # the first is warm-up
        engine.step_records.clear()
        token_ns = [out.t_ns for out in engine.stream(prompt, params)]
        rates.append(decode_tok_per_s(token_ns))
        bandwidths.append(
            decode_bytes_per_s(engine.model_config, engine.step_records, engine.dtype.itemsize)
            / 1e9
        )
    return statistics.median(rates[1:]), statistics.median(bandwidths[1:])


def transformers_decode(dtype: str, tokens: int, repeats: int) -> float:
    """HF generate timed by a streamer: (n - 1) / (t_last - t_first), as for the engine."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = model_store.pull("smollm2-135m")
    model = AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, dtype=getattr(torch, dtype)
    )
    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    ids = tokenizer.apply_chat_template(
        PROMPT, add_generation_prompt=True, return_tensors="pt", return_dict=True
    )["input_ids"]

    class Stamps:
        def __init__(self):
            self.token_ns: list[int] = []
            self.seen_prompt = False

        def put(self, value):
            if self.seen_prompt:
                self.token_ns.append(time.perf_counter_ns())
            self.seen_prompt = True

        def end(self):
            pass

    rates = []
    for _ in range(repeats + 1):
        stamps = Stamps()
        model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=tokens,
            min_new_tokens=tokens,
            do_sample=False,
            streamer=stamps,
            pad_token_id=tokenizer.eos_token_id,
        )
        rates.append(decode_tok_per_s(stamps.token_ns))
    return statistics.median(rates[1:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", action="append", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    for dtype in args.dtype or ["float32", "bfloat16"]:
        ours, gb_per_s = engine_decode(dtype, args.tokens, args.repeats)
        theirs = transformers_decode(dtype, args.tokens, args.repeats)
        print(
            f"{dtype:>9}: llmbench {ours:6.1f} tok/s ({gb_per_s:5.2f} GB/s achieved), "
            f"transformers {theirs:6.1f} tok/s, ratio {ours / theirs:4.2f}x "
            f"[{args.threads} threads, {args.tokens} tokens, median of {args.repeats}]"
        )


if __name__ == "__main__":
    main()
