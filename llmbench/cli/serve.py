"""`llmbench serve`: the OpenAI-compatible server over the built-in engine."""

from __future__ import annotations

from pathlib import Path

import click

from llmbench.cli.options import (
    DEVICE,
    DTYPE,
    KV_CACHE_DTYPE_HELP,
    PORT,
    QUANTIZE_HELP,
    SPECULATIVE_HELP,
    THREADS,
    kv_cache_line,
    speculative_line,
    weights_line,
)
from llmbench.serve.limits import (
    DEFAULT_BODY_TIMEOUT_S,
    DEFAULT_HEADER_TIMEOUT_S,
    DEFAULT_MAX_CONNECTIONS,
)


@click.command()
@click.option("--model", "-m", default="smollm2-135m", show_default=True)
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8000, show_default=True, type=PORT)
@click.option(
    "--dtype",
    default="bfloat16",
    show_default=True,
    type=DTYPE,
    help="The engine's compute and weight dtype (the shipped workloads use bfloat16); clients "
    "read it as 'dtype' in /v1/models.",
)
@click.option("--device", default="auto", show_default=True, type=DEVICE)
@click.option("--threads", default=None, type=THREADS)
@click.option("--kv-cache-memory", default=None, type=float)
@click.option("--max-num-seqs", default=64, show_default=True, type=int)
@click.option("--no-prefix-caching", is_flag=True)
@click.option("--kv-cache-dtype", default="auto", show_default=True, help=KV_CACHE_DTYPE_HELP)
@click.option("--speculative", default="none", show_default=True, help=SPECULATIVE_HELP)
@click.option("--quantize", default="none", show_default=True, help=QUANTIZE_HELP)
@click.option(
    "--served-model-name",
    default=None,
    help="The model name clients must send (default: the --model value).",
)
@click.option(
    "--api-key",
    envvar="LLMBENCH_API_KEY",
    default=None,
    help="Require 'Authorization: Bearer KEY' on /v1/*, /tokenize and /detokenize "
    "(also from $LLMBENCH_API_KEY).",
)
@click.option(
    "--max-model-len",
    default=None,
    type=click.IntRange(min=1),
    help="Cap the context (prompt + max_tokens) below the model's window.",
)
@click.option(
    "--record",
    "record_dir",
    default=None,
    type=click.Path(file_okay=False, path_type=Path),
    help="Stream every engine step, as JSON lines, to DIR/steps.jsonl while serving.",
)
@click.option(
    "--vllm-metrics",
    is_flag=True,
    help="Also expose /metrics under vLLM's names (vllm:time_to_first_token_seconds, ...).",
)
@click.option(
    "--header-timeout",
    "header_timeout_s",
    default=DEFAULT_HEADER_TIMEOUT_S,
    show_default=True,
    type=click.FloatRange(min=0, min_open=True),
    help="Seconds a connection may take to send a request's head (after opening, or after its "
    "last reply: idle kept-alive connections close after it too).",
)
@click.option(
    "--body-timeout",
    "body_timeout_s",
    default=DEFAULT_BODY_TIMEOUT_S,
    show_default=True,
    type=click.FloatRange(min=0, min_open=True),
    help="Seconds a request's body may take to arrive (then a 408).",
)
@click.option(
    "--max-connections",
    default=DEFAULT_MAX_CONNECTIONS,
    show_default=True,
    type=click.IntRange(min=1),
    help="Open connections at most; one more is answered 503 and closed.",
)
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
    kv_cache_dtype: str,
    speculative: str,
    quantize: str,
    served_model_name: str | None,
    api_key: str | None,
    max_model_len: int | None,
    record_dir: Path | None,
    vllm_metrics: bool,
    header_timeout_s: float,
    body_timeout_s: float,
    max_connections: int,
) -> None:
    """Serve MODEL over an OpenAI-compatible HTTP API (/v1/chat/completions with tool calls,
    /v1/completions, /v1/models, /tokenize, /detokenize, /metrics, /health, /version)."""
    from llmbench.engine.engine import LLMEngine
    from llmbench.harness.engine_config import engine_config, engine_spec_of_flags
    from llmbench.serve import ServeConfig, run_server

    config = ServeConfig(
        served_model_name=served_model_name or model,
        api_key=api_key or None,
        max_model_len=max_model_len,
        record_dir=record_dir,
        vllm_metrics=vllm_metrics,
        header_timeout_s=header_timeout_s,
        body_timeout_s=body_timeout_s,
        max_connections=max_connections,
    )
    engine_spec = engine_spec_of_flags(
        threads=threads,
        kv_cache_memory=kv_cache_memory,
        kv_cache_dtype=kv_cache_dtype,
        speculative=speculative,
        quantize=quantize,
        max_num_seqs=max_num_seqs,
        prefix_caching=not no_prefix_caching,
    )
    engine = LLMEngine(engine_config(model, dtype, device, engine_spec))
    click.echo(
        f"llmbench serve: {engine.source_description}, {dtype} on {engine.device}; "
        f"{weights_line(engine)}; {kv_cache_line(engine.kv_cache)}; "
        f"serving it as '{config.served_model_name}'"
        + (f"; {speculative_line(engine)}" if speculative_line(engine) else "")
        + ("; API key required" if config.api_key else ""),
        err=True,
    )
    run_server(
        engine,
        config,
        host=host,
        port=port,
        on_ready=lambda p: click.echo(f"listening on http://{host}:{p}/v1", err=True),
    )
