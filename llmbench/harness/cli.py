"""The `llmbench` command line.

Engine imports are done inside the commands that need them, so `llmbench --help` (and, later,
`report` / `compare`) start fast and work without torch.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from llmbench.errors import UserError
from llmbench.harness.roofline import BYTES_PER_ELEM

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


@cli.command()
@click.argument("run_dir", type=click.Path(path_type=Path))
def report(run_dir: Path) -> None:
    """Render report.html and report.md of RUN_DIR (a run or sweep folder) from its files alone.

    Needs no torch: a report can be rebuilt on any machine that has the folder."""
    from llmbench.reports.render import write_reports

    for path in write_reports(run_dir):
        click.echo(path)


@cli.command()
@click.argument("run_dir", type=click.Path(path_type=Path))
@click.option(
    "--format", "fmt", default="csv", show_default=True, type=click.Choice(["csv", "parquet"])
)
@click.option(
    "--out",
    type=click.Path(path_type=Path),
    default=None,
    help="folder for the tables (default: RUN_DIR/export)",
)
def export(run_dir: Path, fmt: str, out: Path | None) -> None:
    """Flatten RUN_DIR into requests, steps and summary tables (CSV or Parquet) via pandas."""
    from llmbench.reports import rundata
    from llmbench.reports.export import export as export_run

    for path in export_run(rundata.load(run_dir), out or run_dir / "export", fmt):
        click.echo(path)


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


@cli.command("hardware")
@click.option("--device", default="cpu", show_default=True, type=click.Choice(["cpu", "cuda"]))
@click.option("--threads", default=None, type=int, help="CPU threads (default: torch's)")
@click.option("--refresh", is_flag=True, help="measure again instead of using the cache")
@click.option("--json", "as_json", is_flag=True)
def hardware_command(device: str, threads: int | None, refresh: bool, as_json: bool) -> None:
    """Measure (or show the cached) memory bandwidth and matmul FLOP/s of DEVICE."""
    import json

    import torch

    from llmbench.harness import hardware

    if threads:
        torch.set_num_threads(threads)
    if device == "cuda" and not torch.cuda.is_available():
        raise UserError("hardware --device cuda: no CUDA device is visible")
    roofs = hardware.ceilings(device, refresh=refresh)
    if as_json:
        click.echo(json.dumps(roofs, indent=2))
        return
    click.echo(f"{roofs['device']} ({roofs['threads']} threads, torch {roofs['torch']})")
    click.echo(f"  copy bandwidth  {roofs['copy_bytes_per_s'] / 1e9:8.1f} GB/s (read + write)")
    click.echo(f"  read bandwidth  {roofs['read_bytes_per_s'] / 1e9:8.1f} GB/s")
    for dtype, flops in roofs["matmul_flops_per_s"].items():
        click.echo(f"  matmul {dtype:<8} {flops / 1e9:8.1f} GFLOP/s")
    click.echo(f"  ({roofs['method']})")


def _sizes(text: str, option: str) -> list[int]:
    """'1,8,64' or '1k,8k' → [1, 8, 64] / [1024, 8192]."""
    values = []
    for part in text.split(","):
        part = part.strip().lower()
        scale = 1024 if part.endswith("k") else 1
        try:
            value = int(part.removesuffix("k")) * scale
        except ValueError:
            raise UserError(f"{option} {text}: '{part}' is not a count like 8 or 4k") from None
        if value < 1:
            raise UserError(f"{option} {text}: values must be >= 1")
        values.append(value)
    return values


@cli.command()
@click.option(
    "--model", "-m", required=True, help="preset (synthetic:<name> or <name>), folder or .gguf"
)
@click.option(
    "--hardware",
    "hardware_name",
    required=True,
    help="datasheet device (h100, a100-40gb, l4, ...) or 'measured' (this machine's roofs)",
)
@click.option("--batch", default="1,8,64", show_default=True, help="decode batch sizes")
@click.option("--context", default="1k,8k,32k", show_default=True, help="context lengths")
@click.option(
    "--dtype",
    default="bfloat16",
    show_default=True,
    type=click.Choice(sorted(BYTES_PER_ELEM)),
    help="weight storage and math dtype",
)
@click.option(
    "--kv-dtype", default="bfloat16", show_default=True, type=click.Choice(sorted(BYTES_PER_ELEM))
)
@click.option("--tp", default=1, show_default=True, type=int, help="tensor-parallel degree")
@click.option("--json", "as_json", is_flag=True, help="print JSON instead of a table")
@click.option(
    "--html",
    "html_path",
    type=click.Path(path_type=Path),
    default=None,
    help="also write the plots (roofline, tokens/s and TPOT bound vs batch) to this HTML file",
)
def roofline(
    model: str,
    hardware_name: str,
    batch: str,
    context: str,
    dtype: str,
    kv_dtype: str,
    tp: int,
    as_json: bool,
    html_path: Path | None,
) -> None:
    """What-if roofline: step-time bounds, tokens/s and the ridge batch of a model on a device.

    No weights are loaded: the model's shapes and the device's peaks (datasheet, or measured
    here with --hardware measured) are all it takes."""
    import json

    from llmbench.harness import roofline as rl

    config = _model_config(model)
    flops_dtype = "int8" if dtype in ("int8", "int4", "fp8") else dtype
    bandwidth, peak_flops, hardware_label = _peaks(hardware_name, flops_dtype)
    if tp < 1:
        raise UserError("roofline: --tp must be >= 1")
    wbytes, kvbytes = BYTES_PER_ELEM[dtype], BYTES_PER_ELEM[kv_dtype]
    rows = []
    for ctx in _sizes(context, "--context"):
        prefill = rl.step_cost(
            config,
            rl.StepShape(
                prefill=((0, ctx),), weight_bytes_per_param=wbytes, kv_bytes_per_elem=kvbytes, tp=tp
            ),
        )
        ttft_s = rl.time_bound_s(prefill, bandwidth, peak_flops)
        ridge = rl.ridge_batch(config, ctx, wbytes, kvbytes, bandwidth, peak_flops, tp)
        for b in _sizes(batch, "--batch"):
            cost = rl.decode_cost(config, b, ctx, wbytes, kvbytes, tp)
            step_s = rl.time_bound_s(cost, bandwidth, peak_flops)
            is_memory_bound = cost.bytes / bandwidth >= cost.flops / peak_flops
            rows.append(
                {
                    "context": ctx,
                    "batch": b,
                    "decode_step_ms": step_s * 1e3,
                    "bound": "memory" if is_memory_bound else "compute",
                    "decode_tok_per_s": b / step_s,
                    "tpot_ms_bound": step_s * 1e3,
                    "ttft_ms_bound": ttft_s * 1e3,
                    "arithmetic_intensity": cost.arithmetic_intensity,
                    "bytes_per_step": cost.bytes,
                    "flops_per_step": cost.flops,
                    "kv_bytes_per_seq": ctx * config.kv_bytes_per_token(1) * kvbytes / tp,
                    "ridge_batch": ridge,
                }
            )
    result = {
        "model": model,
        "hardware": hardware_label,
        "dtype": dtype,
        "kv_dtype": kv_dtype,
        "tp": tp,
        "peak_bytes_per_s": bandwidth,
        "peak_flops_per_s": peak_flops,
        "points": rows,
    }
    if html_path is not None:
        from llmbench.reports.whatif import render

        html_path.write_text(render(result))
    if as_json:
        click.echo(json.dumps(result, indent=2))
        return
    click.echo(
        f"{model} on {hardware_label} ({dtype} weights, {kv_dtype} KV, tp={tp}; "
        f"{bandwidth / 1e12:.3g} TB/s, {peak_flops / 1e12:.3g} TFLOP/s)"
    )
    click.echo(
        f"{'context':>8}{'batch':>7}{'step ms':>10}{'tok/s':>11}{'bound':>9}"
        f"{'AI':>8}{'TTFT ms':>10}{'ridge':>7}"
    )
    for r in rows:
        click.echo(
            f"{r['context']:>8}{r['batch']:>7}{r['decode_step_ms']:>10.2f}"
            f"{r['decode_tok_per_s']:>11.0f}{r['bound']:>9}{r['arithmetic_intensity']:>8.1f}"
            f"{r['ttft_ms_bound']:>10.1f}{r['ridge_batch'] or '-':>7}"
        )
    if any(r["ridge_batch"] is None for r in rows):
        click.echo(
            "ridge -: no batch up to 65,536 makes decode compute-bound at that context (each "
            "sequence brings its own KV bytes)"
        )
    if html_path is not None:
        click.echo(html_path)


def _peaks(hardware_name: str, flops_dtype: str) -> tuple[float, float, str]:
    """(bytes/s, FLOP/s, label) of a datasheet device, or of this machine's measured roofs."""
    if hardware_name == "measured":
        import torch

        from llmbench.harness import hardware

        measured = hardware.ceilings("cuda" if torch.cuda.is_available() else "cpu")
        peak_flops = measured["matmul_flops_per_s"].get(flops_dtype)
        if peak_flops is None:
            raise UserError(f"roofline: no measured {flops_dtype} matmul rate on this machine")
        label = f"measured {measured['device']} ({measured['threads']} threads)"
        return measured["read_bytes_per_s"], peak_flops, label
    spec = _hardware(hardware_name)
    peak_flops = spec["flops_per_s"].get(flops_dtype)
    if peak_flops is None:
        raise UserError(f"roofline: no datasheet {flops_dtype} FLOP/s for {hardware_name}")
    return spec["memory_bandwidth_bytes_per_s"], peak_flops, hardware_name


def _model_config(model: str):
    from llmbench.engine.presets import PRESETS

    name = model.removeprefix("synthetic:")
    if name in PRESETS:
        return PRESETS[name]
    from llmbench.engine.weights import open_weights

    return open_weights(model).config


def _hardware(name: str) -> dict:
    from llmbench.harness.roofline import HARDWARE, datasheet

    spec = datasheet(name)
    if spec is None:
        raise UserError(f"roofline: unknown hardware '{name}'; known: {', '.join(HARDWARE)}")
    return spec


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
