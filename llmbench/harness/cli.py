"""The `llmbench` command line.

Engine imports are done inside the commands that need them, so `llmbench --help` (and, later,
`report` / `compare`) start fast and work without torch.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from llmbench.errors import UserError

_DTYPE = click.Choice(["float32", "bfloat16", "float16"])
_DEVICE = click.Choice(["auto", "cpu", "cuda"])


def main() -> None:
    """Entry point: user errors become one line on stderr and exit code 2, never a traceback."""
    try:
        cli(standalone_mode=False)
    except UserError as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(2)
    except click.ClickException as e:
        e.show()
        sys.exit(e.exit_code)
    except click.exceptions.Abort:
        click.echo("interrupted", err=True)
        sys.exit(130)
    except KeyboardInterrupt:
        click.echo("interrupted", err=True)
        sys.exit(130)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="llmbench")
def cli() -> None:
    """LLM-inference benchmarking and roofline profiling with a built-in engine."""


@cli.command()
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
@click.option("--dtype", default="float32", show_default=True, type=_DTYPE)
@click.option("--device", default="auto", show_default=True, type=_DEVICE)
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
    from llmbench.harness.generate_stats import DecodeStep, achieved_decode_gb_per_s, format_summary

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
    decode_steps = [
        DecodeStep(r.t_end_ns - r.t_start_ns, r.context_lens[0])
        for r in records
        if not r.num_prefill_tokens
    ]
    gb_per_s = achieved_decode_gb_per_s(
        decode_steps,
        engine.model.decode_weight_bytes(),
        engine.model_config.kv_bytes_per_token(engine.dtype.itemsize),
    )
    stats = format_summary(len(prompt_ids), prefill_ns / 1e6, token_ns, gb_per_s)
    kv = engine.kv_cache
    click.echo(
        f"[{engine.source_description}, {dtype}, {engine.device}, kv cache {kv.num_blocks} "
        f"blocks x {kv.block_size} tokens = {kv.num_bytes / 2**20:.0f} MiB] "
        f"finish={finish_reason} {stats}",
        err=True,
    )


@cli.command()
@click.argument("workload")
@click.option(
    "--set",
    "overrides",
    multiple=True,
    metavar="KEY.PATH=VALUE",
    help="override a spec field, e.g. --set load.concurrency=8 (repeatable)",
)
@click.option(
    "--out",
    type=click.Path(path_type=Path),
    default=None,
    help="run folder (default: <output_dir>/<name>-<time>)",
)
def run(workload: str, overrides: tuple[str, ...], out: Path | None) -> None:
    """Benchmark WORKLOAD (a YAML file, or a shipped name: chat, rag, agentic).

    Prints a summary and, as the last line of stdout, the run folder."""
    from llmbench.harness.run import execute
    from llmbench.harness.spec import load_spec

    spec = load_spec(_workload_path(workload), list(overrides))
    execute(spec, out)


def _workload_path(workload: str) -> Path:
    path = Path(workload)
    if path.is_file():
        return path
    shipped = Path(__file__).resolve().parents[1] / "workloads" / f"{workload}.yaml"
    if path.suffix == "" and shipped.is_file():
        return shipped
    raise UserError(
        f"workload '{workload}': no such file; give a YAML path or one of chat, rag, agentic"
    )


@cli.command()
@click.option("--model", "-m", default="smollm2-135m", show_default=True)
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8000, show_default=True, type=int)
@click.option("--dtype", default="float32", show_default=True, type=_DTYPE)
@click.option("--device", default="auto", show_default=True, type=_DEVICE)
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


@cli.command()
@click.argument("model")
def inspect(model: str) -> None:
    """List MODEL's tensors (name, shape, dtype, bytes) and its size, without loading it."""
    from llmbench.engine.weights import open_weights

    source = open_weights(model)
    infos = source.tensor_infos()
    width = max(len(info.name) for info in infos)
    for info in infos:
        shape = "x".join(str(d) for d in info.shape)
        click.echo(f"{info.name:<{width}}  {shape:>14}  {info.dtype:>8}  {info.num_bytes:>12,}")
    cfg = source.config
    num_params = sum(_numel(info.shape) for info in infos)
    weight_bytes = sum(info.num_bytes for info in infos)
    click.echo("")
    click.echo(f"model            {source.description}")
    click.echo(
        f"layers           {cfg.num_layers}, hidden {cfg.hidden_size}, heads "
        f"{cfg.num_heads} (kv {cfg.num_kv_heads}, head_dim {cfg.head_dim}), "
        f"intermediate {cfg.intermediate_size}, vocab {cfg.vocab_size}, "
        f"context {cfg.max_position_embeddings}"
    )
    click.echo(f"tensors          {len(infos)}")
    click.echo(f"parameters       {num_params:,} ({num_params / 1e6:.1f} M)")
    click.echo(f"weight bytes     {weight_bytes:,} ({weight_bytes / 2**20:.1f} MiB as stored)")
    click.echo(
        f"KV bytes/token   {cfg.kv_bytes_per_token(2):,} (16-bit), "
        f"{cfg.kv_bytes_per_token(4):,} (float32)"
    )


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for dim in shape:
        n *= dim
    return n


@cli.group()
def models() -> None:
    """Fetch and list models."""


@models.command("pull")
@click.argument("name")
@click.option("--force", is_flag=True, help="download again even if cached")
def models_pull(name: str, force: bool) -> None:
    """Download a model by NAME into the llmbench cache ($LLMBENCH_CACHE)."""
    from llmbench.engine import model_store

    if name not in model_store.PULLABLE:
        raise UserError(
            f"models pull: unknown model '{name}'; pullable: {', '.join(model_store.PULLABLE)}"
        )
    click.echo(model_store.pull(name, force=force))


@models.command("list")
def models_list() -> None:
    """Show synthetic presets and pullable models, with sizes."""
    from llmbench.engine import model_store
    from llmbench.engine.presets import PRESETS

    click.echo("pullable (llmbench models pull NAME):")
    pulled = model_store.pulled_models()
    for name, spec in model_store.PULLABLE.items():
        where = pulled.get(name)
        state = (
            f"pulled, {where.stat().st_size / 2**20:.0f} MiB at {where}" if where else "not pulled"
        )
        click.echo(f"  {name:<16} {spec.description} [{state}]")
    click.echo("synthetic presets (--model synthetic:NAME; random weights, real shapes):")
    for name, cfg in PRESETS.items():
        params = cfg.num_params()
        click.echo(
            f"  {name:<16} {params / 1e9:7.3f} B params, {2 * params / 2**30:7.2f} GiB "
            f"in bfloat16, {cfg.num_layers} layers, context {cfg.max_position_embeddings}"
        )
