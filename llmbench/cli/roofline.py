"""`llmbench hardware` (measured roofs) and `llmbench roofline` (what-if bounds on a device)."""

from __future__ import annotations

from pathlib import Path

import click

from llmbench.errors import UserError
from llmbench.harness.cost_model import BYTES_PER_ELEM


@click.command("hardware")
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

    from llmbench.harness import cost_model

    config = _model_config(model)
    # Weight-only GGUF formats are dequantised into 16-bit math; int8/int4/fp8 run int8 math.
    flops_dtype = "int8" if dtype in ("int8", "int4", "fp8") else dtype
    if dtype in cost_model.GGUF_BLOCKS:
        flops_dtype = "bfloat16"
    bandwidth, peak_flops, hardware_label = _peaks(hardware_name, flops_dtype)
    if tp < 1:
        raise UserError("roofline: --tp must be >= 1")
    wbytes, kvbytes = BYTES_PER_ELEM[dtype], BYTES_PER_ELEM[kv_dtype]
    rows = []
    for ctx in _sizes(context, "--context"):
        prefill = cost_model.step_cost(
            config,
            cost_model.StepShape(
                prefill=((0, ctx),), weight_bytes_per_param=wbytes, kv_bytes_per_elem=kvbytes, tp=tp
            ),
        )
        ttft_s = cost_model.time_bound_s(prefill, bandwidth, peak_flops)
        ridge = cost_model.ridge_batch(config, ctx, wbytes, kvbytes, bandwidth, peak_flops, tp)
        for b in _sizes(batch, "--batch"):
            cost = cost_model.decode_cost(config, b, ctx, wbytes, kvbytes, tp)
            step_s = cost_model.time_bound_s(cost, bandwidth, peak_flops)
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

        render(result).write(html_path)  # the page, and its figures as PNGs beside it
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
    from llmbench.harness.hardware import HARDWARE, datasheet

    spec = datasheet(name)
    if spec is None:
        raise UserError(f"roofline: unknown hardware '{name}'; known: {', '.join(HARDWARE)}")
    return spec
