"""`llmbench quality`: perplexity, KL, top-1 and greedy agreement of quantised configurations
against the unquantised model, as a table and as JSON."""

from __future__ import annotations

import json
from pathlib import Path

import click

from llmbench.cli.options import DEVICE, DTYPE, THREADS, check_file_option
from llmbench.errors import UserError


@click.command()
@click.option("--model", "-m", default="smollm2-135m", show_default=True)
@click.option("--dtype", default="float32", show_default=True, type=DTYPE)
@click.option("--device", default="auto", show_default=True, type=DEVICE)
@click.option("--threads", default=None, type=THREADS, help="CPU threads (default: torch's)")
@click.option(
    "--quantize",
    "quantize_values",
    default="none",
    show_default=True,
    help="weight quantisations to compare, comma-separated: none,int8,int4:64",
)
@click.option(
    "--kv-cache-dtype",
    "kv_values",
    multiple=True,
    help="K/V cache formats to compare (repeatable): a comma list of formats for keys and "
    "values alike (auto,int8,int4), or one pair k=int8,v=int4 per option; default auto",
)
@click.option(
    "--text",
    "text_path",
    type=click.Path(path_type=Path),
    default=None,
    help="score this UTF-8 file instead of the built-in texts (Python's pydoc topics and "
    "standard-library source)",
)
@click.option("--tokens", default=1024, show_default=True, type=int, help="tokens scored per text")
@click.option("--context", default=512, show_default=True, type=int, help="tokens per window")
@click.option(
    "--generate", default=32, show_default=True, type=int, help="greedy tokens per prompt"
)
@click.option(
    "--json",
    "json_path",
    type=click.Path(path_type=Path),
    default=None,
    help="also write the result as JSON to this file",
)
def quality(
    model: str,
    dtype: str,
    device: str,
    threads: int | None,
    quantize_values: str,
    kv_values: tuple[str, ...],
    text_path: Path | None,
    tokens: int,
    context: int,
    generate: int,
    json_path: Path | None,
) -> None:
    """Quality of quantised weights and K/V caches against the unquantised model.

    Every combination of --quantize and --kv-cache-dtype values is one row (the unquantised
    reference is always the first): perplexity over windows of --context tokens of each text,
    mean KL divergence of the next-token distributions against the reference, top-1 agreement,
    and the share of --generate greedy tokens made before the first difference."""
    from llmbench.engine.kv_dtype import parse_kv_cache_dtype
    from llmbench.harness import quality as q

    if context < 2 or tokens < 2:
        raise UserError(f"quality: --context and --tokens must be >= 2, got {context}, {tokens}")
    if generate < 0:
        raise UserError(f"quality: --generate must be >= 0, got {generate}")
    quantize = [_quantize_value(v) for v in quantize_values.split(",")]
    kv_cache_dtypes = []
    for value in kv_values or ("auto",):
        parts = [value] if "=" in value else value.split(",")
        kv_cache_dtypes += [parse_kv_cache_dtype(part) for part in parts]
    check_file_option(json_path, "--json")
    texts = [q.file_text(text_path)] if text_path is not None else q.builtin_texts()
    settings = q.QualitySettings(
        model=model,
        dtype=dtype,
        device=device,
        threads=threads,
        context=context,
        num_tokens=tokens,
        generate=generate,
    )
    configs = q.configurations(quantize, kv_cache_dtypes)
    result = q.run_quality(settings, configs, texts, lambda line: click.echo(line, err=True))
    click.echo(q.format_table(result))
    if json_path is not None:
        json_path.write_text(json.dumps(result, indent=2) + "\n")
        click.echo(json_path)


def _quantize_value(text: str) -> str | None:
    """One --quantize value, checked before any model is loaded (a bad one met only at its row
    would cost the rows before it)."""
    from llmbench.engine.quant.scheme import parse_quantize

    value = text.strip()
    if not value:
        raise UserError("--quantize: an empty value; give none, int8, int4:64, ...")
    parse_quantize(value)
    return None if value == "none" else value
