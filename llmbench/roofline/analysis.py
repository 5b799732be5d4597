"""Roofline analysis of a run: each step (or estimated decode window) costed, and the achieved
bandwidth and FLOP/s per phase against the roofs.

Torch-free: steps are records with plain fields, costs come from `cost_model`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from itertools import pairwise
from typing import TYPE_CHECKING, Any

from llmbench.roofline.ceilings import exceeds_ceiling_line
from llmbench.roofline.cost_model import DraftModel, StepShape, decode_cost, draft_cost, step_cost

if TYPE_CHECKING:  # type hints only: `llmbench report` must run without the engine
    from llmbench.engine.config import ModelConfig


def step_phase(num_prefill_tokens: int, num_decode_seqs: int) -> str:
    """`decode` (no prompt token in the step), `prefill` (no decode), or `mixed`."""
    if num_prefill_tokens == 0:
        return "decode"
    return "prefill" if num_decode_seqs == 0 else "mixed"


def cost_steps(
    config: ModelConfig,
    steps: Sequence[Any],
    weight_bytes_per_param: float,
    kv_bytes_per_elem: float,
    draft: DraftModel | None = None,
    lm_head_bytes_per_param: float | None = None,
) -> list[dict[str, Any]]:
    """Every engine step as a roofline point: the record's fields plus `phase`, `num_seqs`,
    `flops` and `bytes` (what `step_cost` says the step computed and moved).

    Each step is anything with `t_start_ns`, `t_end_ns`, `context_lens`, `query_lens`,
    `num_prefill_tokens`, `num_decode_seqs` (a `StepRecord`): a sequence that ran q tokens
    ending at context c is a chunk starting at c - q. A step's `experts_touched` (MoE: distinct
    experts per layer) and `link_bytes` (offloaded weights fetched) are costed when it has them.
    Speculative decoding: the `num_proposed_tokens` draft rows it verified need logits too, and
    the `draft_passes` of a draft model (`draft`) are added to the step's FLOPs and bytes
    and shown apart as `draft_flops` and `draft_bytes`. A quantised model's lm_head has its own
    `lm_head_bytes_per_param` (`cost_model.loaded_bytes_per_param`).
    """
    points = []
    for step in steps:
        shape = StepShape(
            prefill=tuple(
                (c - q, q) for c, q in zip(step.context_lens, step.query_lens, strict=True)
            ),
            weight_bytes_per_param=weight_bytes_per_param,
            kv_bytes_per_elem=kv_bytes_per_elem,
            experts_touched=tuple(getattr(step, "experts_touched", ())),
            link_bytes=getattr(step, "link_bytes", 0),
            num_draft_tokens=getattr(step, "num_proposed_tokens", 0),
            lm_head_bytes_per_param=lm_head_bytes_per_param,
        )
        cost = step_cost(config, shape)
        fields = dataclasses.asdict(step) if dataclasses.is_dataclass(step) else vars(step)
        passes = getattr(step, "draft_passes", ())
        drafted = draft_cost(draft, passes) if draft is not None and passes else None
        points.append(
            {
                **fields,
                "phase": step_phase(step.num_prefill_tokens, step.num_decode_seqs),
                "num_seqs": len(step.context_lens),
                "flops": cost.flops + (drafted.flops if drafted else 0.0),
                "bytes": cost.bytes + (drafted.bytes if drafted else 0.0),
                **({"draft_flops": drafted.flops, "draft_bytes": drafted.bytes} if drafted else {}),
            }
        )
    return points


def estimate_decode_steps(
    config: ModelConfig,
    records: Sequence[Any],
    weight_bytes_per_param: float,
    kv_bytes_per_elem: float,
    num_windows: int = 100,
) -> list[dict[str, Any]]:
    """Decode roofline points of a server seen only from the client, one per time window.

    A server's decode step gives every running stream one token, so within a window:
    batch B = streams in their decode phase (time-averaged), steps = decode tokens / B, and
    each step costs `decode_cost(B, mean context)`. Streams are the successful requests'
    token arrivals (`chunk_ns`, `chunk_tokens`, `num_prompt_tokens`; the first chunk is the
    prefill's). What the server does besides decoding (prefills, stalls) counts as decode
    time here, so the numbers are lower bounds — and always labelled `is_estimated`. A window
    spans at least 10 median inter-token gaps: a token is credited to the window it lands in,
    so a window of about one gap would get a whole step or none.
    Formula: bytes/s of a window = (decode tokens / B) · decode_cost(B, ctx).bytes / window.
    """
    streams = [r for r in records if r.ok and len(r.chunk_ns) > 1]
    if not streams:
        return []
    t0 = min(r.chunk_ns[0] for r in streams)
    t1 = max(r.chunk_ns[-1] for r in streams)
    gaps = sorted(b - a for r in streams for a, b in pairwise(r.chunk_ns))
    width = max((t1 - t0) / num_windows, 10 * gaps[len(gaps) // 2], 1)
    num_windows = max(1, min(num_windows, math.ceil((t1 - t0) / width)))
    windows = [{"stream_ns": 0.0, "tokens": 0, "context_tokens": 0.0} for _ in range(num_windows)]

    def window_of(t_ns: int) -> int:
        return min(int((t_ns - t0) / width), num_windows - 1)

    for r in streams:
        start, end = r.chunk_ns[0], r.chunk_ns[-1]
        for k in range(window_of(start), window_of(end) + 1):  # time-weighted batch
            lo, hi = t0 + k * width, t0 + (k + 1) * width
            windows[k]["stream_ns"] += max(0.0, min(hi, end) - max(lo, start))
        context = r.num_prompt_tokens + r.chunk_tokens[0]
        for t_ns, num_tokens in zip(r.chunk_ns[1:], r.chunk_tokens[1:], strict=True):
            w = windows[window_of(t_ns)]
            w["tokens"] += num_tokens
            # With c tokens known, the k steps behind a chunk of k ran at contexts c .. c+k-1
            # (a decode step's context includes the token it runs).
            w["context_tokens"] += num_tokens * context + num_tokens * (num_tokens - 1) / 2
            context += num_tokens
    points = []
    for k, w in enumerate(windows):
        if w["stream_ns"] == 0:  # nothing decoding: not decode time
            continue
        batch = w["stream_ns"] / width
        num_steps = w["tokens"] / batch  # 0 in a window where streams waited: time, no bytes
        context = max(1, round(w["context_tokens"] / w["tokens"])) if w["tokens"] else 1
        cost = decode_cost(
            config, max(1, round(batch)), context, weight_bytes_per_param, kv_bytes_per_elem
        )
        points.append(
            {
                "t_start_ns": round(t0 + k * width),
                "t_end_ns": round(t0 + (k + 1) * width),
                "phase": "decode",
                "num_seqs": round(batch, 2),
                "num_steps": num_steps,
                "mean_context_len": context,
                "flops": num_steps * cost.flops,
                "bytes": num_steps * cost.bytes,
                "is_estimated": True,
            }
        )
    return points


def phase_utilization(
    points: Sequence[dict[str, Any]],
    peak_read_bytes_per_s: float | None,
    peak_flops_per_s: float | None,
) -> dict[str, dict[str, float | None]]:
    """Achieved bandwidth and FLOP/s per phase of roofline points (`cost_steps`,
    `estimate_decode_steps`), against peak roofs (MBU/MFU None where the roofs are unknown).

    Formula: MBU = Σ bytes / Σ seconds / peak read bandwidth;
             MFU = Σ FLOPs / Σ seconds / peak FLOP/s (sums over the phase's points).
    An MBU or MFU above 1 is None instead: the roof is wrong, not the run
    (`ceiling_warnings` says so).
    """
    totals: dict[str, list[float]] = {}
    for point in points:
        acc = totals.setdefault(point["phase"], [0, 0.0, 0.0, 0.0])
        acc[0] += point.get("num_steps", 1)  # an estimated point stands for several steps
        acc[1] += (point["t_end_ns"] - point["t_start_ns"]) / 1e9
        acc[2] += point["bytes"]
        acc[3] += point["flops"]
    out = {}
    for phase, (num_steps, seconds, num_bytes, flops) in totals.items():
        if seconds <= 0:
            continue
        out[phase] = {
            "num_steps": num_steps,
            "seconds": seconds,
            "bytes_per_s": num_bytes / seconds,
            "flops_per_s": flops / seconds,
            "mbu": _utilization(num_bytes / seconds, peak_read_bytes_per_s),
            "mfu": _utilization(flops / seconds, peak_flops_per_s),
            "arithmetic_intensity": flops / num_bytes if num_bytes else None,
        }
    return out


def _utilization(achieved_per_s: float, peak_per_s: float | None) -> float | None:
    """achieved / peak, or None without a peak or above it (a stale or wrong ceiling)."""
    if not peak_per_s or achieved_per_s > peak_per_s:
        return None
    return achieved_per_s / peak_per_s


def ceiling_warnings(
    phases: dict[str, dict[str, float | None]],
    peak_read_bytes_per_s: float | None,
    peak_flops_per_s: float | None,
    label: str = "measured",
) -> list[str]:
    """A line per phase (`phase_utilization`) whose achieved bandwidth or FLOP/s exceeds its
    roof, where a utilisation above 1 would otherwise be printed. Against measured roofs the
    ceiling is stale or wrong; against a datasheet's (`label` "datasheet <name>", a remote
    server) the bytes or FLOPs assumed are."""
    lines = []
    for name, phase in phases.items():
        for what, achieved, peak, unit in (
            ("bandwidth", phase["bytes_per_s"], peak_read_bytes_per_s, "GB/s"),
            ("FLOP/s", phase["flops_per_s"], peak_flops_per_s, "GFLOP/s"),
        ):
            line = exceeds_ceiling_line(f"{name} {what}", achieved or 0.0, peak, unit, 1e9)
            if line is not None and label.startswith("datasheet"):
                line = (
                    f"{name} {what} estimated at {(achieved or 0.0) / 1e9:.1f} {unit} > "
                    f"{peak / 1e9:.1f} {unit} of the {label}: the weights' bytes assumed are "
                    "too many (set backend.weights) or the server is not on that hardware"
                )
            if line is not None:
                lines.append(line)
    return lines
