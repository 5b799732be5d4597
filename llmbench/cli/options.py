"""Option types shared by several commands."""

from __future__ import annotations

from pathlib import Path

import click

from llmbench.errors import UserError

DTYPE = click.Choice(["float32", "bfloat16", "float16"])
DEVICE = click.Choice(["auto", "cpu", "cuda"])
THREADS = click.IntRange(min=1)  # CPU threads: at least one (none given: torch's default)
PORT = click.IntRange(0, 65535)  # a TCP port; 0: one the OS picks


def check_file_option(path: Path | None, option: str) -> None:
    """A file a command writes at its end (--json, --html, --junit): one whose folder does not
    exist, or that is a folder, is a one-line error before any work, not after it."""
    if path is None:
        return
    if path.is_dir():
        raise UserError(f"{option} {path}: is a folder; give a file name")
    if not path.parent.resolve().is_dir():
        raise UserError(f"{option} {path}: the folder {path.parent} does not exist")


QUANTIZE_HELP = (
    "weight-only quantization of every linear layer at load: none, int8 (per output channel) "
    "or int4[:GROUP][:sym] (a scale and zero point per GROUP of 32, 64 or 128 weights, default "
    "32; sym: no zero point)"
)


def weights_line(engine) -> str:
    """How the engine holds its weights and what a step reads of them, for a start line:
    `weights bfloat16, 256.6 MiB a step, 100% on huge pages` or `weights int4:32, lm_head int8,
    90.4 MiB a step` (the share the OS backed with 2 MiB pages, where asked and known)."""
    from llmbench.harness.run_roofs import weights_label

    held = engine.model.weight_bytes
    streamed = held["layers"] + held["final_norm"] + held["lm_head"]
    name = weights_label(engine, str(engine.dtype).removeprefix("torch."))
    pages = engine.weight_pages
    share = None if pages is None else pages.huge_share
    on_huge = "" if share is None else f", {share:.0%} on huge pages"
    return f"weights {name}, {streamed / 2**20:.1f} MiB a step{on_huge}"


KV_CACHE_DTYPE_HELP = (
    "K/V cache storage: auto (the model's dtype), float32, bfloat16, float16, int8 or int4 "
    "for keys and values, or each apart: k=bfloat16,v=int8"
)


def kv_cache_line(kv) -> str:
    """How the engine's K/V cache is stored and what it holds, for a start line:
    `kv cache k=int8,v=int4: 2,912 blocks x 16 tokens = 46,592 tokens x 9,000 B = 400 MiB`."""
    return (
        f"kv cache {kv.kv_dtype.label}: {kv.num_blocks:,} blocks x {kv.block_size} tokens = "
        f"{kv.num_tokens:,} tokens x {kv.bytes_per_token:,} B = {kv.num_bytes / 2**20:.0f} MiB"
    )


SPECULATIVE_HELP = (
    "speculative decoding: none, ngram[:K] (prompt lookup), or draft:MODEL[:K] with MODEL a "
    "model sharing the tokenizer, or the target made cheaper: self:layers=N (its first N "
    "layers), self:quantize=int8 (a quantised copy), or both (self:layers=N,quantize=int8); "
    "K draft tokens a step (default 4; give it when MODEL ends in :digits); :adaptive last: "
    "each step verifies only the drafts worth their measured cost"
)


def speculative_line(engine) -> str | None:
    """What the engine speculates with, for a start line (None when off):
    `speculative draft self:layers=8 (of 30), k=4, in the target's kv cache`."""
    spec = engine.config.speculative
    if not spec.is_enabled:
        return None
    k = f"k={spec.num_tokens}{' adaptive' if spec.adaptive else ''}"
    if spec.method == "ngram":
        n = f"n {spec.ngram_max} down to {spec.ngram_min}"
        return f"speculative ngram ({n}), {k}"
    draft = engine.proposer
    cache = (
        "in the target's kv cache"
        if draft.shares_target_cache
        else f"draft kv cache {draft.kv_cache.num_bytes / 2**20:.0f} MiB"
    )
    return f"speculative draft {draft.description}, {k}, {cache}"


MOE_OFFLOAD_HELP = (
    "mixture of experts: keep N experts per layer in device memory and fetch the others over "
    "the host link: resident=N[,cache=C (fetched experts kept, LRU)][,link=pcie3|pcie4|pcie5|"
    "25GB/s (simulated; default pcie4 on a CPU) or real (CUDA)][,profile=experts.json (most "
    "routed stay resident; default the first N)][,sleep (a simulated link sleeps its time)]"
)


def verdict_options(command):
    """The options of the commands that judge gates (`compare`, `ab`): what stdout gets, the
    JUnit and HTML files, and what a verdict may rest on."""
    options = [
        click.option(
            "--format",
            "fmt",
            type=click.Choice(["table", "markdown", "json"]),
            default="table",
            show_default=True,
            help="what stdout gets",
        ),
        click.option(
            "--junit", "junit_path", type=click.Path(path_type=Path), help="write JUnit XML"
        ),
        click.option(
            "--html", "html_path", type=click.Path(path_type=Path), help="write the HTML diff"
        ),
        click.option("--allow-busy", is_flag=True, help="call regressions on a busy machine too"),
        click.option(
            "--force-devices", is_flag=True, help="gate raw times/rates across devices too"
        ),
        click.option(
            "--allow-missing",
            is_flag=True,
            help="a gate refused or without data does not make the verdict unusable (exit 0 then)",
        ),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def gpu_hour_price_option(help_text: str):
    """`--gpu-hour-price PRICE`: what the machine costs an hour (> 0), for $/Mtok."""

    def positive(ctx, param, value: float | None) -> float | None:
        if value is not None and not value > 0:
            raise click.BadParameter(f"must be > 0, got {value:g}")
        return value

    return click.option(
        "--gpu-hour-price",
        type=float,
        default=None,
        metavar="PRICE",
        callback=positive,
        help=help_text,
    )
