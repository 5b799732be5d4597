"""`llmbench moe`: mixture-of-experts tools; `moe prune` keeps the experts a workload uses."""

from __future__ import annotations

from pathlib import Path

import click

from llmbench.cli.options import DEVICE, DTYPE, THREADS
from llmbench.errors import UserError


@click.group()
def moe() -> None:
    """Mixture-of-experts tools."""


@moe.command()
@click.argument("model")
@click.option(
    "--workload",
    "-w",
    required=True,
    help="the workload whose routing ranks the experts: a YAML file or chat, rag, agentic",
)
@click.option("--keep", required=True, type=int, help="experts kept per layer")
@click.option(
    "--out", required=True, type=click.Path(path_type=Path), help="new folder for the checkpoint"
)
@click.option(
    "--set",
    "overrides",
    multiple=True,
    metavar="KEY.PATH=VALUE",
    help="override a workload spec field, e.g. --set workload.sessions=4 (repeatable)",
)
@click.option(
    "--dtype",
    default=None,
    type=DTYPE,
    help="the engines' and the checkpoint's dtype (default: the workload's)",
)
@click.option("--device", default=None, type=DEVICE, help="default: the workload's")
@click.option("--threads", default=None, type=THREADS, help="CPU threads (default: the workload's)")
@click.option("--tokens", default=512, show_default=True, type=int, help="tokens scored per text")
@click.option("--context", default=256, show_default=True, type=int, help="tokens per window")
@click.option(
    "--decode-tokens",
    default=64,
    show_default=True,
    type=int,
    help="greedy tokens of the decode-speed request",
)
def prune(
    model: str,
    workload: str,
    keep: int,
    out: Path,
    overrides: tuple[str, ...],
    dtype: str | None,
    device: str | None,
    threads: int | None,
    tokens: int,
    context: int,
    decode_tokens: int,
) -> None:
    """Keep the KEEP most salient experts per layer of MODEL, ranked on a workload.

    Saliency of an expert = routing frequency x mean gate weight x mean output norm, collected
    while the workload's sessions run through the engine. Writes an HF safetensors folder (with
    pruning.json) that llmbench loads, and prints size, decode speed and quality before and
    after."""
    from llmbench.cli.run import workload_path
    from llmbench.harness.moe_prune_study import PruneSettings, check_out, format_report, prune
    from llmbench.harness.spec_load import load_spec

    if keep < 1:
        raise UserError(f"moe prune: --keep must be >= 1, got {keep}")
    if context < 2 or tokens < 2 or decode_tokens < 2:
        raise UserError(
            f"moe prune: --context, --tokens and --decode-tokens must be >= 2, got {context}, "
            f"{tokens}, {decode_tokens}"
        )
    check_out(out)
    spec = load_spec(workload_path(workload), list(overrides))
    settings = PruneSettings(
        model=model,
        spec=spec,
        keep=keep,
        out=out,
        dtype=dtype or spec.dtype,
        device=device or spec.device,
        threads=threads,
        eval_tokens=tokens,
        context=context,
        decode_tokens=decode_tokens,
    )
    result = prune(settings, lambda line: click.echo(line, err=True))
    click.echo(format_report(result))
