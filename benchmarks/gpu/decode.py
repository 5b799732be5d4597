"""Decode points of the engine step: `batch` sequences at `context` tokens, stepped with the
engine's CUDA graphs on, then off (the runner without them: every step eager), each mode
`num_warmup` unmeasured then `num_steps` measured steps.

A measured step's time is its `StepRecord`'s (`t_end_ns − t_start_ns`: the engine's clock,
tokens on the host). Per mode:

  TPOT = mean step time;  tok/s = batch / TPOT
  MBU  = Σ bytes / Σ seconds / measured read roof   (cost model bytes, as a run costs them)
  what-if = `llmbench roofline`'s decode step for the same batch and mean context, on the
            measured roofs (and on the datasheet's); ratio = measured / what-if (≥ 1: the
            roofline is a bound, the ratio says how far above it the step runs)

The prompts are `context − 2·(num_warmup + num_steps) − skew` tokens long, so that no
measured step runs past `context` (8,192: the longest context a decode graph serves). `skew`
is the number of prefill steps: sequences whose prompt is done decode while the others still
prefill, so they run ahead by at most that many tokens (the cost model takes every step's real
contexts).
"""

from __future__ import annotations

import math
import random
import statistics
import time
from typing import Any

from benchmarks.gpu.costing import Roofs, StepCosting, ratio


class PartTimeout(Exception):
    """A part ran past its time box (its sequences aborted, the engine free for the next)."""


class DoesNotFit(Exception):
    """A point needs more K/V blocks than the cache has (batch 64 at 8k on an 80 GB card)."""


def prefill_steps(batch: int, prompt_len: int, max_num_batched_tokens: int) -> int:
    """Engine steps to prefill `batch` prompts at most (the token budget per step, and one more
    per prompt for a chunk boundary).

    Formula: ceil(batch · prompt_len / max_num_batched_tokens) + batch.
    """
    return math.ceil(batch * prompt_len / max_num_batched_tokens) + batch


def start_decoding(
    engine: Any, batch: int, context: int, num_decode_steps: int, deadline: float, seed: int = 0
) -> list[str]:
    """Add `batch` random prompts sized so that `num_decode_steps` more steps end at `context`
    at most, and step until every one has its first token. Returns their request ids."""
    from llmbench.engine.kv_cache import blocks_for
    from llmbench.engine.sampling import SamplingParams

    budget = engine.config.max_num_batched_tokens
    skew = prefill_steps(batch, context, budget)
    prompt_len = context - num_decode_steps - skew
    if prompt_len < 1:
        raise ValueError(f"context {context} leaves no prompt for {num_decode_steps} steps")
    need = batch * blocks_for(context + 1, engine.config.block_size)
    if need > engine.blocks.num_free_blocks:
        raise DoesNotFit(
            f"batch {batch} at context {context} needs {need} K/V blocks, "
            f"{engine.blocks.num_free_blocks} are free"
        )
    rng = random.Random(seed)
    vocab = engine.model_config.vocab_size
    params = SamplingParams(
        max_tokens=num_decode_steps + skew + 2, temperature=0.0, ignore_eos=True
    )
    ids = [
        engine.add_request([rng.randrange(vocab) for _ in range(prompt_len)], params)
        for _ in range(batch)
    ]
    started: set[str] = set()
    while len(started) < batch:
        if time.monotonic() > deadline:
            stop(engine, ids)
            raise PartTimeout(f"prefill of {batch} x {prompt_len} tokens ran out of time")
        started |= {out.request_id for out in engine.step() if out.new_token_ids}
    return ids


def stop(engine: Any, ids: list[str]) -> None:
    """Abort `ids` and take the aborts in: their blocks are free for the next point."""
    for request_id in ids:
        engine.abort(request_id)
    engine.step()


def measured_steps(engine: Any, num_warmup: int, num_steps: int) -> list[Any]:
    """`num_warmup` steps, then the `StepRecord`s of `num_steps` more."""
    for _ in range(num_warmup):
        engine.step()
    for _ in range(num_steps):
        engine.step()
    return list(engine.step_records)[-num_steps:]


def decode_point(
    engine: Any,
    costing: StepCosting,
    roofs: Roofs,
    batch: int,
    context: int,
    num_warmup: int,
    num_steps: int,
    deadline: float,
) -> list[dict[str, Any]]:
    """Rows for graphs on and off at (batch, context)."""
    graphs = engine.runner.decode_graphs
    ids = start_decoding(engine, batch, context, 2 * (num_warmup + num_steps), deadline)
    rows = []
    try:
        for mode in ("on", "off"):
            engine.runner.decode_graphs = graphs if mode == "on" else None
            records = measured_steps(engine, num_warmup, num_steps)
            rows.append(_row(records, costing, roofs, batch, context, mode, graphs))
    finally:
        engine.runner.decode_graphs = graphs
        stop(engine, ids)
    return rows


def _row(records, costing: StepCosting, roofs: Roofs, batch, context, mode, graphs) -> dict:
    if any(r.num_prefill_tokens or r.num_decode_seqs != batch for r in records):
        raise ValueError(f"a measured step was not a decode of {batch} sequences")
    step_ms = [(r.t_end_ns - r.t_start_ns) / 1e6 for r in records]
    contexts = [c for r in records for c in r.context_lens]
    mean_context = round(statistics.mean(contexts))
    measured = costing.phase(records, roofs, "decode")
    tpot_ms = statistics.mean(step_ms)
    what_if = costing.what_if(mean_context, batch, (roofs.read_bytes_per_s, roofs.flops_per_s))
    sheet = costing.what_if(
        mean_context, batch, (roofs.datasheet_bytes_per_s, roofs.datasheet_flops_per_s)
    )
    predicted_ms = what_if and what_if["decode_step_ms"]
    sheet_ms = sheet and sheet["decode_step_ms"]
    return {
        "batch": batch,
        "context": context,
        "context_mean": mean_context,
        "context_max": max(contexts),
        "graphs": mode,
        # Whether these steps ran from captured graphs (a CPU has none; contexts past the
        # graphs' longest run eagerly).
        "is_graphed": bool(
            mode == "on"
            and graphs is not None
            and graphs.is_captured
            and max(contexts) <= graphs.max_context_len
        ),
        "num_steps": len(records),
        "tpot_ms": tpot_ms,
        "tpot_ms_median": statistics.median(step_ms),
        "tok_per_s": batch / (tpot_ms / 1e3),
        "bytes_per_step": measured["bytes_per_step"],
        "bytes_per_s": measured["bytes_per_s"],
        "mbu": measured["mbu"],
        "whatif_ms": predicted_ms,
        "whatif_bound": what_if and what_if["bound"],
        "measured_over_whatif": ratio(tpot_ms, predicted_ms),
        "datasheet_whatif_ms": sheet_ms,
        "measured_over_datasheet": ratio(tpot_ms, sheet_ms),
    }
