"""`llmbench models pull|list` and `llmbench inspect`: fetch, list and look inside models."""

from __future__ import annotations

import click

from llmbench.errors import UserError


@click.command()
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


@click.group()
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
