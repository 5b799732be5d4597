"""The peer table's numbers and lines from the rounds' measurements: medians, GB/s, MBU, ratios
to `transformers`, greedy-token agreement, and the targets the engine is held to."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from llmbench.roofline import cost_model
from llmbench.roofline.ceilings import exceeds_ceiling_line

if TYPE_CHECKING:
    from llmbench.engine.config import ModelConfig

REFERENCE_ROW = "llmbench float32"  # the greedy tokens every row is checked against


@dataclass(frozen=True)
class RowResult:
    """One row after the rounds: its measured rates (warm-up left out), median achieved bytes/s,
    and the token ids of its last generation. `precision`: float32, 16-bit, 8-bit or 4-bit."""

    name: str
    precision: str
    tok_per_s: tuple[float, ...]
    bytes_per_s: float
    token_ids: tuple[int, ...]

    @property
    def median_tok_per_s(self) -> float:
        return statistics.median(self.tok_per_s)


@dataclass(frozen=True)
class Target:
    """`numerator`'s MBU (no denominator), or its tok/s over `denominator`'s, at least `minimum`."""

    numerator: str
    denominator: str | None
    minimum: float

    @property
    def label(self) -> str:
        if self.denominator is None:
            return f"{self.numerator} MBU"
        return f"{self.numerator} / {self.denominator} tok/s"


TARGETS = (
    Target("llmbench float32", None, 0.85),
    Target("llmbench bfloat16", None, 0.8),
    Target("llmbench int8", None, 0.7),
    Target("llmbench int4", None, 0.7),
    Target("llmbench int8", "llmbench bfloat16", 1.7),
    Target("llmbench int4", "llmbench bfloat16", 2.5),
    Target("llmbench bfloat16", "llama.cpp F16", 1.0),
    Target("llmbench float32", "transformers float32", 2.0),
    Target("llmbench bfloat16", "transformers bfloat16", 3.0),
    Target("llmbench int8", "CTranslate2 int8", 1.0),
    Target("llmbench int4", "llama.cpp Q4_1", 1.0),
)


def estimated_bytes_per_token(
    config: ModelConfig, weight_bytes: float, kv_elem_bytes: float, prompt_len: int, tokens: int
) -> float:
    """Bytes one decode step of an engine without step records reads: its weights once, plus
    the cost model's K/V traffic at the timed steps' mean context.

    Formula: W + kv_read(c̄) + kv_write, c̄ = prompt_len + tokens // 2 (the steps that make
    tokens 2..n see contexts prompt_len + 1 .. prompt_len + n − 1; K/V bytes are linear in c).
    """
    context = prompt_len + tokens // 2
    kv = cost_model.decode_cost(config, 1, context, 1.0, kv_elem_bytes).breakdown
    return weight_bytes + kv["kv_read_bytes"] + kv["kv_write_bytes"]


def agreed_prefix(token_ids: Sequence[int], reference: Sequence[int]) -> int:
    """How many leading tokens two greedy generations share."""
    count = 0
    for a, b in zip(token_ids, reference, strict=False):
        if a != b:
            break
        count += 1
    return count


def transformers_row(precision: str) -> str:
    """The `transformers` row a row's speed is divided by: float32 for float32 rows, bfloat16
    for every lower precision (transformers runs no 8- or 4-bit weights on this CPU)."""
    return "transformers float32" if precision == "float32" else "transformers bfloat16"


def mbu(bytes_per_s: float, read_bytes_per_s: float) -> float | None:
    """Formula: achieved bytes/s / measured read bytes/s; None above 1 (a stale ceiling)."""
    value = bytes_per_s / read_bytes_per_s
    return None if value > 1 else value


def table_lines(results: Sequence[RowResult], read_bytes_per_s: float) -> list[str]:
    """The table, one line a row, then one line per row whose GB/s is above the ceiling."""
    by_name = {r.name: r for r in results}
    reference = by_name.get(REFERENCE_ROW)
    lines = [
        f"{'engine':<23}{'tok/s':>7}{'(min-max)':>15}{'GB/s':>7}{'MBU':>6}{'x HF':>6}{'agree':>10}"
    ]
    notes = []
    for r in results:
        spread = f"({min(r.tok_per_s):.1f}-{max(r.tok_per_s):.1f})"
        util = mbu(r.bytes_per_s, read_bytes_per_s)
        hf = by_name.get(transformers_row(r.precision))
        ratio = "-" if hf is None else f"{r.median_tok_per_s / hf.median_tok_per_s:.2f}"
        agree = (
            "-"
            if reference is None
            else f"{agreed_prefix(r.token_ids, reference.token_ids)}/{len(reference.token_ids)}"
        )
        lines.append(
            f"{r.name:<23}{r.median_tok_per_s:7.1f}{spread:>15}{r.bytes_per_s / 1e9:7.2f}"
            f"{'>1' if util is None else f'{util:.2f}':>6}{ratio:>6}{agree:>10}"
        )
        note = exceeds_ceiling_line(r.name, r.bytes_per_s, read_bytes_per_s, "GB/s", 1e9)
        if note:
            notes.append(note)
    return lines + notes


def target_lines(results: Sequence[RowResult], read_bytes_per_s: float) -> list[str]:
    """Each target's measured value, its minimum and whether it is met ("-": a row not run)."""
    by_name = {r.name: r for r in results}
    lines = []
    for target in TARGETS:
        numerator = by_name.get(target.numerator)
        denominator = by_name.get(target.denominator) if target.denominator else None
        value: float | None = None
        if numerator is not None and target.denominator is None:
            value = mbu(numerator.bytes_per_s, read_bytes_per_s)
        elif numerator is not None and denominator is not None:
            value = numerator.median_tok_per_s / denominator.median_tok_per_s
        if value is None:
            is_run = numerator is not None and (target.denominator is None or denominator)
            shown, verdict = "-", "above the ceiling" if is_run else "not run"
        else:
            shown, verdict = f"{value:.2f}", "met" if value >= target.minimum else "NOT met"
        lines.append(f"{target.label:<50}{shown:>6}  (>= {target.minimum:g}) {verdict}")
    return lines
