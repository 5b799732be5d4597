"""`llmbench generate`: one prompt through the engine, text to stdout, timings to stderr."""

from __future__ import annotations

import sys

import click

from llmbench.cli.options import DEVICE, DTYPE


@click.command()
@click.argument("prompt")
@click.option(
    "--model",
    "-m",
    default="smollm2-135m",
    show_default=True,
    help="pulled model name, HF folder, .gguf file, or synthetic:<preset>",
)
@click.option("--max-tokens", default=128, show_default=True, type=int)
@click.option("--temperature", default=0.0, show_default=True, type=float, help="0 = greedy")
@click.option("--top-p", default=1.0, show_default=True, type=float)
@click.option("--top-k", default=0, show_default=True, type=int, help="0 = off")
@click.option("--min-p", default=0.0, show_default=True, type=float)
@click.option("--seed", default=None, type=int)
@click.option("--stop", multiple=True, help="stop string (repeatable)")
@click.option("--ignore-eos", is_flag=True, help="keep generating past end-of-sequence")
@click.option("--chat", is_flag=True, help="wrap the prompt in the model's chat template")
@click.option("--dtype", default="float32", show_default=True, type=DTYPE)
@click.option("--device", default="auto", show_default=True, type=DEVICE)
@click.option("--threads", default=None, type=int, help="CPU threads (default: torch's)")
@click.option(
    "--kv-cache-memory",
    default=None,
    type=float,
    help="KV cache size: bytes, or a fraction (<= 1) of free GPU memory",
)
@click.option("--block-size", default=16, show_default=True, type=int, help="tokens per KV block")
def generate(
    prompt: str,
    model: str,
    max_tokens: int,
    temperature: float,
    top_p: float,
    top_k: int,
    min_p: float,
    seed: int | None,
    stop: tuple[str, ...],
    ignore_eos: bool,
    chat: bool,
    dtype: str,
    device: str,
    threads: int | None,
    kv_cache_memory: float | None,
    block_size: int,
) -> None:
    """Generate text for PROMPT, streamed to stdout; timings go to stderr."""
    from llmbench.engine.engine import EngineConfig, LLMEngine
    from llmbench.engine.sampling import SamplingParams
    from llmbench.harness.generate_stats import decode_bytes_per_s, format_summary

    params = SamplingParams(
        max_tokens=max_tokens,
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
        min_p=min_p,
        seed=seed,
        stop=stop,
        ignore_eos=ignore_eos,
    )
    engine = LLMEngine(
        EngineConfig(
            model=model,
            dtype=dtype,
            device=device,
            num_threads=threads,
            max_num_seqs=1,
            kv_cache_memory=kv_cache_memory,
            block_size=block_size,
        )
    )
    tokenizer = engine.tokenizer
    if chat:
        prompt_ids = tokenizer.encode_chat([{"role": "user", "content": prompt}])
    else:
        prompt_ids = tokenizer.encode(prompt)
    token_ns = []
    finish_reason = None
    for out in engine.stream(prompt_ids, params):
        token_ns.append(out.t_ns)
        finish_reason = out.finish_reason
        sys.stdout.write(out.new_text)
        sys.stdout.flush()
    sys.stdout.write("\n")
    sys.stdout.flush()
    records = engine.step_records
    prefill_ns = sum(r.t_end_ns - r.t_start_ns for r in records if r.num_prefill_tokens)
    bytes_per_s = decode_bytes_per_s(engine.model_config, records, engine.dtype.itemsize)
    stats = format_summary(len(prompt_ids), prefill_ns / 1e6, token_ns, bytes_per_s)
    kv = engine.kv_cache
    click.echo(
        f"[{engine.source_description}, {dtype}, {engine.device}, kv cache {kv.num_blocks} "
        f"blocks x {kv.block_size} tokens = {kv.num_bytes / 2**20:.0f} MiB] "
        f"finish={finish_reason} {stats}",
        err=True,
    )
