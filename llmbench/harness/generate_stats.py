"""The one-line timing summary `llmbench generate` prints after the text."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from llmbench.roofline import analysis, cost_model

if TYPE_CHECKING:
    from llmbench.engine.config import ModelConfig


def decode_bytes_per_s(
    config: ModelConfig,
    steps: Sequence[Any],
    elem_bytes: float,
    kv_bytes_per_elem: float | None = None,
    draft: cost_model.DraftModel | None = None,
    weight_bytes: Mapping[str, float] | None = None,
) -> float | None:
    """Achieved bandwidth of the decode-only steps, by the roofline's cost model (weights once
    per step, K/V read over each context and written for the new token). None without one.
    `kv_bytes_per_elem`: the cache's own (a quantised one); None: elem_bytes. `draft`: a
    speculative draft model (`speculative_stats.draft_model_of`), whose passes count in their
    steps. `weight_bytes`: the loaded model's bytes per part (`LlamaModel.weight_bytes`, a
    quantised model's real bytes); None: elem_bytes per weight.

    Formula: Σ step_cost(step).bytes / Σ step time over decode-only steps.
    """
    kv_bytes = elem_bytes if kv_bytes_per_elem is None else kv_bytes_per_elem
    weight_bpp, lm_head_bpp = elem_bytes, None
    if weight_bytes is not None:
        weight_bpp, lm_head_bpp = cost_model.loaded_bytes_per_param(config, weight_bytes)
    points = analysis.cost_steps(config, steps, weight_bpp, kv_bytes, draft, lm_head_bpp)
    decode = analysis.phase_utilization(points, None, None).get("decode")
    return None if decode is None else decode["bytes_per_s"]


def decode_tok_per_s(token_ns: Sequence[int]) -> float:
    """Formula: (n - 1) / (t_last - t_first) for a single stream's token timestamps."""
    if len(token_ns) < 2 or token_ns[-1] == token_ns[0]:
        return 0.0
    return (len(token_ns) - 1) / ((token_ns[-1] - token_ns[0]) / 1e9)


def format_summary(
    num_prompt_tokens: int, prefill_ms: float, token_ns: Sequence[int], bytes_per_s: float | None
) -> str:
    achieved = "-" if bytes_per_s is None else f"{bytes_per_s / 1e9:.2f}"
    return (
        f"prompt={num_prompt_tokens} tok, prefill={prefill_ms:.1f} ms, "
        f"output={len(token_ns)} tok, decode={decode_tok_per_s(token_ns):.1f} tok/s, "
        f"achieved={achieved} GB/s"
    )


def link_line(records) -> str:
    """Link traffic of steps (`StepRecord`s), for a summary line: `link 3.4 MiB in 12 of 40
    steps, 0.11 ms simulated`."""
    moved = [r for r in records if r.link_bytes]
    total = sum(r.link_bytes for r in moved)
    simulated = sum(r.link_s_simulated for r in moved)
    line = f"link {total / 2**20:.2f} MiB in {len(moved)} of {len(records)} steps"
    return line + (f", {simulated * 1e3:.3g} ms simulated" if simulated else "")
