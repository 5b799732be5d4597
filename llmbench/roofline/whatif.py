"""The what-if table of `llmbench roofline`: decode and prefill bounds of a model on a device,
from the model's shapes and the device's peaks alone (no weights, no torch).

Each row is one (context, decode batch): the decode step's cost and its time bound
max(bytes / bandwidth, FLOPs / peak), the tokens/s and TPOT that allows, the TTFT bound of a
prefill of that context, and the batch where decode turns compute-bound. A mixture-of-experts
model's decode step reads the experts its batch is expected to reach under uniform routing
(`cost_model.expected_experts_touched`), so its bytes grow with the batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from llmbench.roofline import cost_model

if TYPE_CHECKING:  # type hints only: the what-if runs without the engine's torch
    from llmbench.engine.config import ModelConfig


def whatif_rows(
    config: ModelConfig,
    peak_bytes_per_s: float,
    peak_flops_per_s: float,
    contexts: Sequence[int],
    batches: Sequence[int],
    weight_bytes_per_param: float,
    kv_bytes_per_elem: float,
    tp: int = 1,
) -> list[dict[str, Any]]:
    """A row per (context, batch), contexts outer.

    Formula: decode_step_ms = max(bytes / peak_bytes_per_s, flops / peak_flops_per_s) · 1e3
    of `decode_cost(batch, context)`; decode_tok_per_s = batch / step seconds; ttft_ms_bound =
    the same bound of one prefill of `context` tokens; experts_touched_per_layer =
    E·(1 − (1 − k/E)^batch) for a MoE model (None when dense); kv_bytes_per_seq = context ·
    `kv_bytes_per_position`, one device's K/V of a sequence.
    """
    wbytes, kvbytes = weight_bytes_per_param, kv_bytes_per_elem
    kv_bytes_per_position = cost_model.kv_bytes_per_position(config, kvbytes, tp)  # or raises
    rows = []
    for ctx in contexts:
        prefill = cost_model.step_cost(
            config,
            cost_model.StepShape(
                prefill=((0, ctx),), weight_bytes_per_param=wbytes, kv_bytes_per_elem=kvbytes, tp=tp
            ),
        )
        ttft_s = cost_model.time_bound_s(prefill, peak_bytes_per_s, peak_flops_per_s)
        ridge = cost_model.ridge_batch(
            config, ctx, wbytes, kvbytes, peak_bytes_per_s, peak_flops_per_s, tp
        )
        for batch in batches:
            cost = cost_model.decode_cost(config, batch, ctx, wbytes, kvbytes, tp)
            step_s = cost_model.time_bound_s(cost, peak_bytes_per_s, peak_flops_per_s)
            is_memory_bound = cost.bytes / peak_bytes_per_s >= cost.flops / peak_flops_per_s
            touched = None
            if config.num_experts:
                touched = cost_model.expected_experts_touched(
                    config.num_experts, config.num_experts_per_tok, batch
                )
            rows.append(
                {
                    "context": ctx,
                    "batch": batch,
                    "decode_step_ms": step_s * 1e3,
                    "bound": "memory" if is_memory_bound else "compute",
                    "decode_tok_per_s": batch / step_s,
                    "tpot_ms_bound": step_s * 1e3,
                    "ttft_ms_bound": ttft_s * 1e3,
                    "arithmetic_intensity": cost.arithmetic_intensity,
                    "bytes_per_step": cost.bytes,
                    "expert_bytes_per_step": cost.breakdown["expert_bytes"],
                    "experts_touched_per_layer": touched,
                    "flops_per_step": cost.flops,
                    "kv_bytes_per_seq": ctx * kv_bytes_per_position,
                    "ridge_batch": ridge,
                }
            )
    return rows
