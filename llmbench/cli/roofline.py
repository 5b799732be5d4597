"""`llmbench hardware` (measured roofs) and `llmbench roofline` (what-if bounds on a device)."""

from __future__ import annotations

import statistics
from pathlib import Path

import click

from llmbench.cli.options import THREADS, check_file_option, gpu_hour_price_option
from llmbench.errors import UserError
from llmbench.roofline.cost_model import BYTES_PER_ELEM


@click.command("hardware")
@click.option("--device", default="cpu", show_default=True, type=click.Choice(["cpu", "cuda"]))
@click.option("--threads", default=None, type=THREADS, help="CPU threads (default: torch's)")
@click.option("--refresh", is_flag=True, help="measure again instead of using the cache")
@click.option("--json", "as_json", is_flag=True)
def hardware_command(device: str, threads: int | None, refresh: bool, as_json: bool) -> None:
    """Measure (or show the cached) memory bandwidth and matmul FLOP/s of DEVICE."""
    import json

    import torch

    from llmbench.harness.provenance import LoadMonitor
    from llmbench.roofline import ceilings

    if threads:
        torch.set_num_threads(threads)
    if device == "cuda" and not torch.cuda.is_available():
        raise UserError("hardware --device cuda: no CUDA device is visible")
    # Watched: roofs measured while other processes are busy are not cached as the machine's.
    roofs = ceilings.ceilings(device, refresh=refresh, watch_load=LoadMonitor)
    if as_json:
        click.echo(json.dumps(roofs, indent=2))
        return
    click.echo(f"{roofs['device']} ({roofs['threads']} threads, torch {roofs['torch']})")
    click.echo(hardware_table(roofs))
    click.echo(f"  read roof: {roofs['read_bytes_per_s'] / 1e9:.1f} GB/s, {_read_source(roofs)}")
    for note in roofs.get("notes", []):
        click.echo(f"  note: {note}")
    click.echo(f"  ({roofs['method']})")


def hardware_table(roofs: dict) -> str:
    """Every probe: how it ran, its best and median rate, the spread of its runs, and where its
    number came from (measured now, or the cache and its date)."""
    lines = [
        f"  {'probe':<14}{'threads':>8}{'best':>11}{'median':>11}{'spread':>8}{'runs':>6}  "
        "unit     source"
    ]
    for name, probe in roofs["probes"].items():
        scale = 1e9
        unit = "GB/s" if probe.get("unit") == "B/s" else "GFLOP/s"
        best = probe.get("best_per_s")
        median = probe.get("median_per_s")
        spread = probe.get("spread")
        lines.append(
            f"  {name:<14}{probe.get('threads') or '-':>8}"
            f"{'-' if best is None else f'{best / scale:.1f}':>11}"
            f"{'-' if median is None else f'{median / scale:.1f}':>11}"
            f"{'-' if spread is None else f'{spread:.0%}':>8}{probe['repeats']:>6}  "
            f"{unit:<8} {roofs.get('sources', {}).get(name, '')}"
        )
    for name, probe in roofs["probes"].items():  # how steady the bandwidth held (ceilings)
        rates = sorted(probe.get("allocation_best_per_s") or ())
        if len(rates) >= 2:
            middle = statistics.median(rates)
            lines.append(
                f"  {name}: the best of each fresh buffer {rates[0] / 1e9:.1f} / "
                f"{middle / 1e9:.1f} / {rates[-1] / 1e9:.1f} GB/s (min / median / max), "
                f"{1 - rates[0] / rates[-1]:.0%} apart"
            )
    return "\n".join(lines)


def _read_source(roofs: dict) -> str:
    return roofs.get("sources", {}).get("read_bytes_per_s", "probe read")


# The largest --batch or --context, far past any deployment (a batch of 10^11 sequences ran out
# of memory building the step's shape).
MAX_SIZE = 2**24


def _sizes(text: str, option: str) -> list[int]:
    """'1,8,64' or '1k,8k' → [1, 8, 64] / [1024, 8192], each 1 .. MAX_SIZE."""
    values = []
    for part in text.split(","):
        part = part.strip().lower()
        scale = 1024 if part.endswith("k") else 1
        try:
            value = int(part.removesuffix("k")) * scale
        except ValueError:
            raise UserError(f"{option} {text}: '{part}' is not a count like 8 or 4k") from None
        if not 1 <= value <= MAX_SIZE:
            raise UserError(f"{option} {text}: values must be 1 .. {MAX_SIZE:,}")
        values.append(value)
    return values


@click.command()
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
    "--kv-dtype",
    default="bfloat16",
    show_default=True,
    help="KV cache storage, keys and values alike (int8) or apart (k=bfloat16,v=int4); int8 and "
    "int4 with a float16 scale per token and KV head, as the built-in engine stores them",
)
@click.option(
    "--tp",
    default=1,
    show_default=True,
    type=click.IntRange(min=1),
    help="tensor-parallel degree: it divides the query heads, and divides the KV heads or is a "
    "multiple of them (then each device holds one KV head, replicated)",
)
@click.option("--json", "as_json", is_flag=True, help="print JSON instead of a table")
@gpu_hour_price_option(
    "what the device costs an hour (e.g. 2.5 for an H100 at $2.50/h): each row gains the least "
    "a million decode tokens can cost on it, at the tokens/s bound"
)
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
    gpu_hour_price: float | None,
    html_path: Path | None,
) -> None:
    """What-if roofline: step-time bounds, tokens/s and the ridge batch of a model on a device.

    No weights are loaded: the model's shapes and the device's peaks (datasheet, or measured
    here with --hardware measured) are all it takes."""
    import json

    from llmbench.roofline import cost_model
    from llmbench.roofline.whatif import whatif_rows

    check_file_option(html_path, "--html")
    config = _model_config(model)
    try:
        cost_model.kv_heads_per_device(config, tp)
    except ValueError as e:
        raise UserError(f"roofline: --{e}") from None  # "tp 3: does not divide ..."
    # Weight-only GGUF formats are dequantised into 16-bit math; int8/int4/fp8 run int8 math.
    flops_dtype = "int8" if dtype in ("int8", "int4", "fp8") else dtype
    if dtype in cost_model.GGUF_BLOCKS:
        flops_dtype = "bfloat16"
    bandwidth, peak_flops, hardware_label = _peaks(hardware_name, flops_dtype)
    rows = whatif_rows(
        config,
        bandwidth,
        peak_flops,
        _sizes(context, "--context"),
        _sizes(batch, "--batch"),
        BYTES_PER_ELEM[dtype],
        _kv_bytes_per_elem(kv_dtype, config.head_dim),
        tp,
    )
    if gpu_hour_price is not None:
        from llmbench.roofline.machine_cost import per_million_tokens

        for row in rows:
            row["cost_per_million_tokens_bound"] = per_million_tokens(
                gpu_hour_price, row["decode_tok_per_s"]
            )
    result = {
        "model": model,
        "gpu_hour_price": gpu_hour_price,
        "hardware": hardware_label,
        "dtype": dtype,
        "kv_dtype": kv_dtype,
        "tp": tp,
        "num_experts": config.num_experts,
        "num_experts_per_tok": config.num_experts_per_tok,
        "peak_bytes_per_s": bandwidth,
        "peak_flops_per_s": peak_flops,
        "points": rows,
    }
    if html_path is not None:
        from llmbench.reports.whatif import render

        render(result).write(html_path)  # the page, and its figures as PNGs beside it
    if as_json:
        click.echo(json.dumps(result, indent=2))
        return
    click.echo(
        f"{model} on {hardware_label} ({dtype} weights, {kv_dtype} KV, tp={tp}; "
        f"{bandwidth / 1e12:.3g} TB/s, {peak_flops / 1e12:.3g} TFLOP/s)"
    )
    is_moe = bool(config.num_experts)
    if is_moe:
        click.echo(
            f"{config.num_experts} experts per layer, top-{config.num_experts_per_tok}: a decode "
            "step of B sequences reads E(1 - (1 - k/E)^B) of them per layer (experts), expected "
            "under uniform routing"
        )
    experts = f"{'experts':>9}" if is_moe else ""
    price = f"{'$/Mtok':>9}" if gpu_hour_price is not None else ""
    click.echo(
        f"{'context':>8}{'batch':>7}{'step ms':>10}{'tok/s':>11}{'bound':>9}"
        f"{'AI':>8}{'GB/step':>9}{experts}{'TTFT ms':>10}{'ridge':>7}{price}"
    )
    for r in rows:
        touched = r["experts_touched_per_layer"]
        experts = f"{touched:>9.2f}" if is_moe else ""
        price = ""
        if gpu_hour_price is not None:
            price = f"{r['cost_per_million_tokens_bound']:>9.3f}"
        click.echo(
            f"{r['context']:>8}{r['batch']:>7}{r['decode_step_ms']:>10.2f}"
            f"{r['decode_tok_per_s']:>11.0f}{r['bound']:>9}{r['arithmetic_intensity']:>8.1f}"
            f"{r['bytes_per_step'] / 1e9:>9.3f}{experts}"
            f"{r['ttft_ms_bound']:>10.1f}{r['ridge_batch'] or '-':>7}{price}"
        )
    if gpu_hour_price is not None:
        click.echo(
            f"$/Mtok: at {gpu_hour_price:g} an hour, the least a million decode tokens cost at "
            "the tokens/s bound (no engine reaches it; a run's --gpu-hour-price prices what it "
            "measured)"
        )
    if any(r["ridge_batch"] is None for r in rows):
        click.echo(
            "ridge -: no batch up to 65,536 makes decode compute-bound at that context (each "
            "sequence brings its own KV bytes)"
        )
    if html_path is not None:
        click.echo(html_path)


def _kv_bytes_per_elem(text: str, head_dim: int) -> float:
    """--kv-dtype as bytes per K/V element: a storage name for both, or k=NAME,v=NAME."""
    from llmbench.roofline.cost_model import kv_bytes_per_elem

    sides = {"k": text.strip(), "v": text.strip()}
    if "=" in text:
        pairs = [part.partition("=") for part in text.split(",")]
        sides = {side.strip(): name.strip() for side, _, name in pairs}
    if set(sides) != {"k", "v"} or any(n not in BYTES_PER_ELEM for n in sides.values()):
        raise UserError(
            f"roofline: --kv-dtype {text}: give a storage name or k=NAME,v=NAME, each one of "
            f"{', '.join(sorted(BYTES_PER_ELEM))}"
        )
    return kv_bytes_per_elem(sides["k"], sides["v"], head_dim)


def _peaks(hardware_name: str, flops_dtype: str) -> tuple[float, float, str]:
    """(bytes/s, FLOP/s, label) of a datasheet device, or of this machine's measured roofs."""
    if hardware_name == "measured":
        import torch

        from llmbench.harness.provenance import LoadMonitor
        from llmbench.roofline import ceilings

        device = "cuda" if torch.cuda.is_available() else "cpu"
        measured = ceilings.ceilings(device, watch_load=LoadMonitor)
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
    from llmbench.roofline.datasheets import HARDWARE, datasheet

    spec = datasheet(name)
    if spec is None:
        raise UserError(f"roofline: unknown hardware '{name}'; known: {', '.join(HARDWARE)}")
    return spec
