"""Speculative decoding over a run: draft tokens proposed and accepted, and the time split
between drafting and verifying, from the engine's steps (roofline points)."""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from llmbench.roofline.cost_model import DraftModel, loaded_bytes_per_param


def speculative_summary(points: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """The run summary's `speculative` block; None when no step drafted (speculation off, or a
    backend that does not report steps).

    Formula: acceptance_rate = Σ accepted / Σ proposed;
             mean_accepted_per_verify = Σ accepted / Σ verifies (a verify: one sequence's drafts
             checked in one step); mean_tokens_per_verify = (Σ accepted + Σ verifies) / Σ
             verifies (the accepted drafts plus the token the target adds);
             draft_s = Σ draft_ns; verify_s = Σ (t_end − t_start − draft_ns) over the steps
             that verified drafts; draft_fraction = draft_s / Σ step time; the verify step's
             cost against a decode step's: `verify_cost`; num_withheld_tokens = Σ the drafts
             the adaptive budget kept out of the steps (`engine.draft_budget`).
    """
    drafting = [p for p in points if p.get("draft_ns", 0) or p.get("num_proposed_tokens", 0)]
    if not drafting:
        return None
    proposed = sum(p.get("num_proposed_tokens", 0) for p in drafting)
    accepted = sum(p.get("num_accepted_tokens", 0) for p in drafting)
    verifies = sum(p.get("num_verify_seqs", 0) for p in drafting)
    draft_ns = sum(p.get("draft_ns", 0) for p in drafting)
    verify_ns = sum(
        p["t_end_ns"] - p["t_start_ns"] - p.get("draft_ns", 0)
        for p in drafting
        if p.get("num_verify_seqs", 0)
    )
    step_ns = sum(p["t_end_ns"] - p["t_start_ns"] for p in points)
    return {
        "num_proposed_tokens": proposed,
        "num_accepted_tokens": accepted,
        "num_withheld_tokens": sum(p.get("num_withheld_tokens", 0) for p in drafting),
        "acceptance_rate": accepted / proposed if proposed else None,
        "num_verifies": verifies,
        "mean_accepted_per_verify": accepted / verifies if verifies else None,
        "mean_tokens_per_verify": (accepted + verifies) / verifies if verifies else None,
        "draft_s": draft_ns / 1e9,
        "verify_s": verify_ns / 1e9,
        "draft_fraction": draft_ns / step_ns if step_ns else None,
        "draft_flops": sum(p.get("draft_flops", 0.0) for p in drafting),
        "draft_bytes": sum(p.get("draft_bytes", 0.0) for p in drafting),
        **verify_cost(points),
    }


def verify_cost(points: Sequence[dict[str, Any]]) -> dict[str, float | None]:
    """What a step that verifies drafts costs against a plain decode step, both decode-shaped
    (`phase` decode: no prefill chunk), compared at equal numbers of sequences.

    Formula: for each sequence count n with both kinds of step, r_n = median(verify steps'
             t_end − t_start − draft_ns) / median(plain decode steps' t_end − t_start);
             verify_over_decode = Σ_n v_n·r_n / Σ_n v_n, v_n the verify steps with n sequences;
             verify_step_ms and decode_step_ms: the medians over those n, all together.
             All null where no n has both (speculation that always drafted, or never).
    """
    verify: dict[int, list[float]] = defaultdict(list)
    plain: dict[int, list[float]] = defaultdict(list)
    for p in points:
        if p.get("phase") != "decode":
            continue
        step_ms = (p["t_end_ns"] - p["t_start_ns"] - p.get("draft_ns", 0)) / 1e6
        kind = verify if p.get("num_verify_seqs", 0) else plain
        kind[p.get("num_seqs", len(p.get("context_lens", ())))].append(step_ms)
    shared = sorted(set(verify) & set(plain))
    if not shared:
        return {"verify_step_ms": None, "decode_step_ms": None, "verify_over_decode": None}
    weights = [len(verify[n]) for n in shared]
    ratios = [statistics.median(verify[n]) / statistics.median(plain[n]) for n in shared]
    return {
        "verify_step_ms": statistics.median([t for n in shared for t in verify[n]]),
        "decode_step_ms": statistics.median([t for n in shared for t in plain[n]]),
        "verify_over_decode": sum(w * r for w, r in zip(weights, ratios, strict=True))
        / sum(weights),
    }


def format_speculative(block: dict[str, Any]) -> str:
    """The run summary table's line: acceptance, tokens per verify, and the time split."""
    rate, per_verify = block["acceptance_rate"], block["mean_tokens_per_verify"]
    cost = block.get("verify_over_decode")
    costs = "" if cost is None else f"; a verify step costs {cost:.2f}x a decode step"
    withheld = block.get("num_withheld_tokens", 0)
    kept_out = f" ({withheld} more withheld as not worth their cost)" if withheld else ""
    return (
        f"speculative: {block['num_accepted_tokens']} of {block['num_proposed_tokens']} draft "
        f"tokens accepted ({'-' if rate is None else f'{rate:.0%}'}){kept_out}, "
        f"{'-' if per_verify is None else f'{per_verify:.2f}'} tokens per verify; "
        f"drafting {block['draft_s']:.2f} s, verifying {block['verify_s']:.2f} s{costs}"
    )


def draft_model_of(engine: Any) -> DraftModel | None:
    """The engine's speculative draft model as the cost model sees it (None: no draft model
    runs): its shape, its loaded bytes per weight (quantised ones included), its cache's."""
    config = engine.draft_model_config
    if config is None:
        return None
    proposer = engine.proposer
    bpp, lm_head_bpp = loaded_bytes_per_param(config, proposer.model.weight_bytes)
    return DraftModel(config, bpp, proposer.kv_cache.bytes_per_elem, lm_head_bpp)
