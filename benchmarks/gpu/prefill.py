"""Prefill points of the engine step: one random prompt of `num_tokens` tokens (one token to
generate), run `num_repeats` times after a warm-up; the step that ran the whole prompt is timed
by its `StepRecord`.

  MFU = FLOPs of the step (cost model) / its time / the measured matmul roof in the dtype
  what-if = `llmbench roofline`'s TTFT bound of a `num_tokens` prefill on the measured roofs;
            ratio = measured / what-if

MFU and the ratio are given for the median repeat, MFU also for the best.
"""

from __future__ import annotations

import random
import time
from typing import Any

from benchmarks.gpu.costing import Roofs, StepCosting, ratio
from benchmarks.gpu.decode import PartTimeout


def prefill_once(engine: Any, num_tokens: int, rng: random.Random) -> Any:
    """Run one prompt of `num_tokens` to its one token; the `StepRecord` of its prefill."""
    from llmbench.engine.sampling import SamplingParams

    vocab = engine.model_config.vocab_size
    params = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    engine.add_request([rng.randrange(vocab) for _ in range(num_tokens)], params)
    first = len(engine.step_records)
    while engine.has_unfinished():
        engine.step()
    steps = [r for r in list(engine.step_records)[first:] if r.num_prefill_tokens]
    if len(steps) != 1 or steps[0].num_prefill_tokens != num_tokens:
        split = [r.num_prefill_tokens for r in steps]
        raise ValueError(f"the {num_tokens}-token prompt ran in steps of {split} tokens")
    return steps[0]


def prefill_point(
    engine: Any,
    costing: StepCosting,
    roofs: Roofs,
    num_tokens: int,
    num_repeats: int,
    deadline: float,
) -> dict[str, Any]:
    rng = random.Random(num_tokens)
    prefill_once(engine, num_tokens, rng)  # warm-up: kernels compiled for these shapes
    records = []
    for _ in range(num_repeats):
        if time.monotonic() > deadline:
            if not records:
                raise PartTimeout(f"prefill of {num_tokens} tokens ran out of time")
            break
        records.append(prefill_once(engine, num_tokens, rng))
    ordered = sorted(records, key=lambda r: r.t_end_ns - r.t_start_ns)
    median = ordered[(len(ordered) - 1) // 2]
    best = ordered[0]
    at_median = costing.phase([median], roofs, "prefill")
    at_best = costing.phase([best], roofs, "prefill")
    step_ms = (median.t_end_ns - median.t_start_ns) / 1e6
    what_if = costing.what_if(num_tokens, 1, (roofs.read_bytes_per_s, roofs.flops_per_s))
    predicted_ms = what_if and what_if["ttft_ms_bound"]
    return {
        "num_tokens": num_tokens,
        "num_repeats": len(records),
        "step_ms": step_ms,
        "step_ms_best": (best.t_end_ns - best.t_start_ns) / 1e6,
        "step_ms_all": [(r.t_end_ns - r.t_start_ns) / 1e6 for r in records],
        "tok_per_s": num_tokens / (step_ms / 1e3),
        "flops": at_median["flops_per_step"],
        "flops_per_s": at_median["flops_per_s"],
        "mfu": at_median["mfu"],
        "mfu_best": at_best["mfu"],
        "whatif_ms": predicted_ms,
        "measured_over_whatif": ratio(step_ms, predicted_ms),
    }
