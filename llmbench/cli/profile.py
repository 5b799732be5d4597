"""`llmbench profile`: where each engine step's time goes, op by op, against each op's roof."""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path

import click

from llmbench.cli.options import QUANTIZE_HELP, THREADS, check_file_option
from llmbench.cli.roofline import _sizes
from llmbench.errors import UserError


@click.command("profile")
@click.option(
    "--model", "-m", required=True, help="preset (synthetic:<name> or <name>), folder or .gguf"
)
@click.option("--dtype", default="bfloat16", show_default=True, help="float32, bfloat16, float16")
@click.option("--quantize", default="none", show_default=True, help=QUANTIZE_HELP)
@click.option("--batch", default="1", show_default=True, help="sequences per step, e.g. 1,8,32")
@click.option("--context", default="1k", show_default=True, help="context length(s), e.g. 512,4k")
@click.option(
    "--phase",
    default="decode",
    show_default=True,
    help="decode, prefill or verify (speculative decoding's steps: k drafts a sequence)",
)
@click.option(
    "--drafts", default=4, show_default=True, type=int, help="verify: draft tokens a sequence"
)
@click.option("--steps", default=8, show_default=True, type=int, help="profiled steps per point")
@click.option("--threads", default=None, type=THREADS, help="CPU threads (default: torch's)")
@click.option("--html", "html_path", type=click.Path(path_type=Path), default=None)
@click.option("--json", "json_path", type=click.Path(path_type=Path), default=None)
def profile(
    model: str,
    dtype: str,
    quantize: str,
    batch: str,
    context: str,
    phase: str,
    drafts: int,
    steps: int,
    threads: int | None,
    html_path: Path | None,
    json_path: Path | None,
) -> None:
    """Run real engine steps on the CPU under torch.profiler and put every op on the
    roofline: its time per step, bytes and FLOPs (the cost model's, op by op), achieved rates,
    the fraction of its roof and the time it loses against it; the step's total against its
    roofline bound, and the time no op holds (Python, dispatch). A machine busy with other
    work while it ran is named first: its times are pessimistic."""
    from llmbench.engine.quant.scheme import parse_quantize
    from llmbench.harness.engine_config import engine_config
    from llmbench.harness.provenance import LoadMonitor
    from llmbench.harness.run_warnings import busy_line
    from llmbench.harness.spec import EngineSpec
    from llmbench.roofline import profile_table
    from llmbench.roofline.profile import ProfileSpec
    from llmbench.roofline.profile import profile as run_profile

    if dtype not in ("float32", "bfloat16", "float16"):
        raise UserError(f"profile: --dtype {dtype}: use float32, bfloat16 or float16")
    scheme = parse_quantize(quantize)
    spec = ProfileSpec(
        model,
        dtype,
        quantize=None if scheme is None else quantize,
        batches=tuple(_sizes(batch, "--batch")),
        contexts=tuple(_sizes(context, "--context")),
        phase=phase,
        num_steps=steps,
        num_drafts=drafts,
        threads=threads,
    )
    check_file_option(html_path, "--html")
    check_file_option(json_path, "--json")
    # torch.profiler's tracer (kineto) prints a "USDT: profiler_start/stop" line per profiled
    # point unless its log level is above 5; read once, when torch loads.
    os.environ.setdefault("KINETO_LOG_LEVEL", "6")
    import torch

    from llmbench.roofline import ceilings

    if threads:
        torch.set_num_threads(threads)

    def say(message: str) -> None:
        click.echo(f"profile: {message}", err=True)

    roofs = ceilings.ceilings(
        "cpu",
        first=dtype,
        progress=lambda probe: say(f"measuring the roofs: {probe}"),
        watch_load=LoadMonitor,  # roofs measured busy are not cached as the machine's
    )
    engine = engine_config(model, dtype, "cpu", EngineSpec(threads=threads, quantize=spec.quantize))
    with LoadMonitor() as monitor:  # other processes' CPU, as a run measures it
        result = run_profile(spec, engine, roofs, say)
    load = monitor.load()
    busy = busy_line(load, "profile")
    result |= {"machine_load": asdict(load), "warnings": [busy] if busy else []}
    click.echo("\n".join(profile_table.lines(result)))
    if json_path is not None:
        json_path.write_text(json.dumps(result, indent=2) + "\n")
        click.echo(json_path)
    if html_path is not None:
        from llmbench.reports.profile_page import render

        render(result).write(html_path)
        click.echo(html_path)
