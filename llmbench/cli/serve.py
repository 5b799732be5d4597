"""`llmbench serve`: the OpenAI-compatible server over the built-in engine."""

from __future__ import annotations

import click

from llmbench.cli.options import DEVICE, DTYPE


@click.command()
@click.option("--model", "-m", default="smollm2-135m", show_default=True)
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8000, show_default=True, type=int)
@click.option("--dtype", default="float32", show_default=True, type=DTYPE)
@click.option("--device", default="auto", show_default=True, type=DEVICE)
@click.option("--threads", default=None, type=int)
@click.option("--kv-cache-memory", default=None, type=float)
@click.option("--max-num-seqs", default=64, show_default=True, type=int)
@click.option("--no-prefix-caching", is_flag=True)
def serve(
    model: str,
    host: str,
    port: int,
    dtype: str,
    device: str,
    threads: int | None,
    kv_cache_memory: float | None,
    max_num_seqs: int,
    no_prefix_caching: bool,
) -> None:
    """Serve MODEL over an OpenAI-compatible HTTP API (/v1/completions, /v1/chat/completions)."""
    from llmbench.engine.engine import EngineConfig, LLMEngine
    from llmbench.harness.serve import run_server

    engine = LLMEngine(
        EngineConfig(
            model=model,
            dtype=dtype,
            device=device,
            num_threads=threads,
            kv_cache_memory=kv_cache_memory,
            max_num_seqs=max_num_seqs,
            enable_prefix_caching=not no_prefix_caching,
        )
    )
    kv = engine.kv_cache
    click.echo(
        f"llmbench serve: {engine.source_description}, {dtype} on {engine.device}; "
        f"kv cache {kv.num_blocks} blocks x {kv.block_size} tokens "
        f"({kv.num_bytes / 2**20:.0f} MiB)",
        err=True,
    )
    run_server(
        engine,
        model,
        host=host,
        port=port,
        on_ready=lambda p: click.echo(f"listening on http://{host}:{p}/v1", err=True),
    )
