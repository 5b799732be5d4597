"""`llmbench generate`: one prompt through the engine, text to stdout, timings to stderr."""

from __future__ import annotations

import sys

import click

from llmbench.cli.options import (
    DEVICE,
    DTYPE,
    KV_CACHE_DTYPE_HELP,
    MOE_OFFLOAD_HELP,
    QUANTIZE_HELP,
    SPECULATIVE_HELP,
    THREADS,
    kv_cache_line,
    speculative_line,
    weights_line,
)


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
@click.option("--threads", default=None, type=THREADS, help="CPU threads (default: torch's)")
@click.option(
    "--kv-cache-memory",
    default=None,
    type=float,
    help="KV cache size: bytes, or a fraction (<= 1) of free GPU memory",
)
@click.option("--block-size", default=16, show_default=True, type=int, help="tokens per KV block")
@click.option("--kv-cache-dtype", default="auto", show_default=True, help=KV_CACHE_DTYPE_HELP)
@click.option("--speculative", default="none", show_default=True, help=SPECULATIVE_HELP)
@click.option("--quantize", default="none", show_default=True, help=QUANTIZE_HELP)
@click.option("--moe-offload", default="none", show_default=True, help=MOE_OFFLOAD_HELP)
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
    kv_cache_dtype: str,
    speculative: str,
    quantize: str,
    moe_offload: str,
) -> None:
    """Generate text for PROMPT, streamed to stdout; timings go to stderr."""
    from llmbench.engine.engine import LLMEngine
    from llmbench.engine.sampling import SamplingParams
    from llmbench.harness.engine_config import (
        engine_config,
        engine_spec_of_flags,
        parse_moe_offload,
    )
    from llmbench.harness.generate_stats import decode_bytes_per_s, format_summary, link_line
    from llmbench.harness.speculative_stats import draft_model_of

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
    engine_spec = engine_spec_of_flags(
        threads=threads,
        kv_cache_memory=kv_cache_memory,
        kv_cache_dtype=kv_cache_dtype,
        speculative=speculative,
        quantize=quantize,
        block_size=block_size,
        max_num_seqs=1,
        moe_offload=parse_moe_offload(moe_offload),
    )
    engine = LLMEngine(engine_config(model, dtype, device, engine_spec))
    tokenizer = engine.tokenizer
    if chat:
        prompt_ids = tokenizer.encode_chat([{"role": "user", "content": prompt}])
    else:
        prompt_ids = tokenizer.encode(prompt)
    token_ns = []
    finish_reason = None
    last = None
    for out in engine.stream(prompt_ids, params):
        token_ns += [out.t_ns] * len(out.new_token_ids)  # a verify step may bring several
        finish_reason = out.finish_reason
        last = out
        sys.stdout.write(out.new_text)
        sys.stdout.flush()
    sys.stdout.write("\n")
    sys.stdout.flush()
    records = engine.step_records
    prefill_ns = sum(r.t_end_ns - r.t_start_ns for r in records if r.num_prefill_tokens)
    kv = engine.kv_cache
    bytes_per_s = decode_bytes_per_s(
        engine.model_config,
        records,
        engine.dtype.itemsize,
        kv.bytes_per_elem,
        draft_model_of(engine),
        engine.model.weight_bytes,
    )
    stats = format_summary(len(prompt_ids), prefill_ns / 1e6, token_ns, bytes_per_s)
    click.echo(
        f"[{engine.source_description}, {dtype}, {engine.device}, {engine.model.kernels_name}, "
        f"{weights_line(engine)}, {kv_cache_line(kv)}] "
        f"finish={finish_reason} {stats}",
        err=True,
    )
    if engine.moe_offload is not None:
        click.echo(f"[{engine.moe_offload.describe()}] {link_line(records)}", err=True)
    spec_line = speculative_line(engine)
    if spec_line and last is not None:
        proposed, accepted = last.num_proposed_tokens, last.num_accepted_tokens
        rate = f" ({accepted / proposed:.0%})" if proposed else ""
        click.echo(f"[{spec_line}] {accepted} of {proposed} draft tokens accepted{rate}", err=True)
