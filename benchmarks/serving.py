"""Serving-engine benchmarks: batched decode throughput and prefix-cache TTFT.

    python benchmarks/serving.py decode --streams 1,32
    python benchmarks/serving.py prefix --sessions 16 --prefix-tokens 1024

Both drive `LLMEngine` in-process and read its `StepRecord`s, so the numbers are the engine's
own, without any client or HTTP in the way. Medians over `--repeats` runs.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from llmbench.engine.engine import EngineConfig, LLMEngine
from llmbench.engine.sampling import SamplingParams


def _engine(args: argparse.Namespace, prefix_caching: bool = True) -> LLMEngine:
    return LLMEngine(
        EngineConfig(
            model=args.model,
            dtype=args.dtype,
            device="cpu",
            num_threads=args.threads,
            max_num_seqs=max(64, args.max_streams),
            enable_prefix_caching=prefix_caching,
        )
    )


def _random_prompt(engine: LLMEngine, num_tokens: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    # Ids from the middle of the vocabulary: ordinary text pieces, no special tokens.
    return torch.randint(1000, 20000, (num_tokens,), generator=g).tolist()


def decode_tok_per_s(engine: LLMEngine, num_streams: int, output_tokens: int, seed: int) -> float:
    """Decode-only steps of `num_streams` requests started together: tokens / time."""
    params = SamplingParams(max_tokens=output_tokens, temperature=0.0, ignore_eos=True)
    prompts = [_random_prompt(engine, 32, seed + i) for i in range(num_streams)]
    engine.step_records.clear()
    engine.generate(prompts, params)
    steps = [r for r in engine.step_records if r.num_prefill_tokens == 0]
    tokens = sum(r.num_decode_seqs for r in steps)
    seconds = sum(r.t_end_ns - r.t_start_ns for r in steps) / 1e9
    return tokens / seconds


def mean_ttft_s(engine: LLMEngine, args: argparse.Namespace, seed: int) -> tuple[float, float]:
    """Sessions arriving every `interval` s, sharing a prefix: mean TTFT from the *scheduled*
    arrival, and the prefix-cache hit rate."""
    prefix = _random_prompt(engine, args.prefix_tokens, seed)
    prompts = [prefix + _random_prompt(engine, 32, seed + 1 + i) for i in range(args.sessions)]
    params = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
    start = time.perf_counter_ns()
    scheduled = {}
    first_token_ns: dict[str, int] = {}
    pending = list(enumerate(prompts))
    while pending or engine.has_unfinished():
        now = time.perf_counter_ns()
        while pending and start + pending[0][0] * args.interval * 1e9 <= now:
            i, prompt = pending.pop(0)
            scheduled[engine.add_request(prompt, params)] = start + int(i * args.interval * 1e9)
        if not engine.has_unfinished():
            time.sleep(0.001)
            continue
        for out in engine.step():
            if out.new_token_ids:
                first_token_ns.setdefault(out.request_id, out.t_ns)
    ttfts = [(first_token_ns[r] - t) / 1e9 for r, t in scheduled.items()]
    return statistics.mean(ttfts), engine.prefix_cache_hit_rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("which", choices=["decode", "prefix"])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--streams", default="1,32")
    parser.add_argument("--output-tokens", type=int, default=64)
    parser.add_argument("--sessions", type=int, default=16)
    parser.add_argument("--prefix-tokens", type=int, default=1024)
    parser.add_argument("--interval", type=float, default=0.5, help="seconds between sessions")
    args = parser.parse_args()
    args.max_streams = max(int(s) for s in args.streams.split(","))
    if args.which == "decode":
        engine = _engine(args)
        decode_tok_per_s(engine, 1, 8, seed=0)  # warm-up
        results = {}
        for streams in (int(s) for s in args.streams.split(",")):
            runs = [
                decode_tok_per_s(engine, streams, args.output_tokens, seed=100 * r)
                for r in range(args.repeats)
            ]
            results[streams] = statistics.median(runs)
            print(
                f"{streams:>4} streams: {results[streams]:8.1f} decode tok/s "
                f"(runs: {', '.join(f'{x:.1f}' for x in runs)})"
            )
        base = results[min(results)]
        for streams, value in results.items():
            print(f"{streams:>4} streams: {value / base:5.2f}x the {min(results)}-stream rate")
    else:
        for caching in (True, False):
            engine = _engine(args, prefix_caching=caching)
            runs = [mean_ttft_s(engine, args, seed=1000 * (r + 1)) for r in range(args.repeats)]
            ttft = statistics.median(t for t, _ in runs)
            print(
                f"prefix caching {'on ' if caching else 'off'}: mean TTFT {ttft * 1e3:8.1f} ms "
                f"(runs: {', '.join(f'{t * 1e3:.0f}' for t, _ in runs)} ms; "
                f"hit rate {runs[-1][1]:.2f})"
            )


if __name__ == "__main__":
    main()
