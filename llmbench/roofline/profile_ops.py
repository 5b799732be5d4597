"""Which op of the model each profiler event of a step belongs to, from the events alone.

Torch-free: an event is its aten name, its input shapes and its wall time (`OpEvent`), taken
from `torch.profiler` by `profile`. Only the step's top-level events are classified (those the
engine's Python called; their children's time is inside theirs). The engine's torch path runs
every layer in the same order (model.py's forward), so a few anchors place every event:

- a matmul (`aten::mm`, `aten::addmm`, ..., the extension's `gemv` and its int8/int4
  `quant_gemv` and `quant_gemm`) is the linear layer whose weight has its shape [in, out]
  (`linear_names`): qkv_proj, o_proj, gate_up_proj, down_proj, and the lm_head once every
  layer's down_proj has run;
- `aten::embedding`, `aten::rms_norm`, `aten::index_copy_` (the K/V write), `aten::silu`,
  `aten::scaled_dot_product_attention` name themselves, and so do the spans the engine opens
  around its host work (`engine.spans`: the scheduler, the step's inputs, sampling, the new
  tokens taken in), each span's Python and ops together;
- an event that names its op (`OpEvent.op`: a row of the fused decode layers' own op clock) is
  that op;
- every other event (views, slices, casts, the RoPE complex multiply, the K/V gather) belongs to
  the region the last anchor opened: after qkv_proj RoPE, after the K/V write attention, after
  gate_up_proj SiLU·mul, after the lm_head sampling, before the embedding the step's inputs.
  A transpose right before a matmul is that matmul's (the weight's `.t()` view).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # type hints only: torch-free
    from llmbench.engine.config import ModelConfig

MATMULS = ("aten::mm", "aten::addmm", "aten::matmul", "aten::linear")
# The CPU C++ extension's ops (`kernels.cpu_extension`): "<namespace>::<op>", the namespace
# "llmbench_cpu_ext_<isa>_<build hash>" (`cpu_extension.LIBRARY_PREFIX`, not imported: this
# module is torch-free). Its matmul, "gemv", has the inputs (x, weight [out, in], bias,
# residual); the others name themselves (`EXTENSION_OPS`). Only the current prefix: events are
# classified in the process that recorded them, which can only have loaded the library its own
# code builds, so an older build's namespace ("llmbench_cpu_gemv_...") is never met.
CPU_EXTENSION_PREFIX = "llmbench_cpu_ext_"
EXTENSION_OPS = {
    "rms_norm": "rms_norm",
    "rope_": "rope",
    "silu_and_mul": "silu_mul",
    "write_kv_": "kv_write",
    "paged_decode_attention": "attention",
    "prefill_attention": "attention",
}
# The extension's int8/int4 matmuls (`kernels.cpu_quant_gemv`'s OP and GEMM_OP, copied: this
# module is torch-free; a test holds the copies to them): inputs (x [M, K], codes [N/16, ·, 16,
# 4], ...), the rows N padded to a multiple of `QUANT_ROW_BLOCK` (its ROW_BLOCK) at load.
QUANT_MATMULS = ("quant_gemv", "quant_gemm")
QUANT_ROW_BLOCK = 16
TRANSPOSES = ("aten::t", "aten::transpose", "aten::permute", "aten::numpy_T")
# An anchor → the op that the events after it (until the next anchor) belong to.
REGION_AFTER = {
    "embedding": "embedding",
    "qkv_proj": "rope",
    "kv_write": "attention",
    "o_proj": "o_proj",
    "gate_up_proj": "silu_mul",
    "silu_mul": "silu_mul",
    "down_proj": "down_proj",
    "lm_head": "sampling",
}
NAMED = {
    "aten::embedding": "embedding",
    "aten::rms_norm": "rms_norm",
    "aten::index_copy_": "kv_write",
    "aten::silu": "silu_mul",
    "aten::scaled_dot_product_attention": "attention",
}


@dataclass(frozen=True)
class OpEvent:
    """One top-level profiler event of a step: aten name, input shapes, wall time (µs); `op`
    where its source already knows it (a fused stack of layers' own op clock)."""

    name: str
    shapes: tuple[tuple[int, ...], ...]
    duration_us: float
    op: str | None = None


def linear_names(config: ModelConfig) -> dict[tuple[int, int], str]:
    """Weight shape [in, out] as a matmul sees it → the layer (the lm_head apart: it shares a
    shape only with layers that run before it)."""
    h, q, kv, inter = config.hidden_size, config.q_size, config.kv_size, config.intermediate_size
    return {
        (h, q + 2 * kv): "qkv_proj",
        (q, h): "o_proj",
        (h, 2 * inter): "gate_up_proj",
        (inter, h): "down_proj",
    }


def _weight_shape(event: OpEvent) -> tuple[int, int] | None:
    """[in, out] of a matmul's weight: mm(x, w_t) and matmul: the 2nd input; addmm(add, x, w_t):
    the 3rd; linear(x, w [out, in]): the 2nd, reversed; the int8/int4 matmuls: x's columns and
    the codes' row blocks (out padded to whole blocks, `padded`)."""
    if event.name.rpartition("::")[2] in QUANT_MATMULS:
        x, codes = (event.shapes + ((), ()))[:2]
        if len(x) != 2 or not codes:
            return None
        return x[1], codes[0] * QUANT_ROW_BLOCK
    position = {"aten::addmm": 2}.get(event.name, 1)
    if len(event.shapes) <= position or len(event.shapes[position]) != 2:
        return None
    rows, cols = event.shapes[position]
    is_out_in = event.name == "aten::linear" or event.name.startswith(CPU_EXTENSION_PREFIX)
    return (cols, rows) if is_out_in else (rows, cols)


def padded(shape: tuple[int, int]) -> tuple[int, int]:
    """[in, out] with out rounded up to whole row blocks, as the int8/int4 layouts hold it."""
    rows, block = shape[1], QUANT_ROW_BLOCK
    return shape[0], -(-rows // block) * block


def classify(events: Sequence[OpEvent], config: ModelConfig) -> list[str]:
    """The op (`profile_costs.OPS`) of each of a step's top-level events, in order."""
    from llmbench.engine import spans  # torch-free: the names of the engine's host spans

    named = {
        **NAMED,
        spans.SCHEDULE: "schedule",
        spans.INPUTS: "inputs",
        spans.SAMPLING: "sampling",
        spans.OUTPUTS: "outputs",
    }
    exact = linear_names(config)
    layers = {padded(shape): name for shape, name in exact.items()} | exact  # int8/int4's too
    lm_head = (config.hidden_size, config.vocab_size)
    lm_heads = (lm_head, padded(lm_head))  # float, int8/int4
    labels: list[str] = []
    region, num_down = "inputs", 0
    for event in events:
        is_extension = event.name.startswith(CPU_EXTENSION_PREFIX)
        extension_op = event.name.rpartition("::")[2] if is_extension else None
        label = EXTENSION_OPS.get(extension_op) if is_extension else named.get(event.name)
        if event.op is not None:
            label = event.op
            num_down += label == "down_proj"
        elif event.name in MATMULS or extension_op == "gemv" or extension_op in QUANT_MATMULS:
            shape = _weight_shape(event)
            is_lm_head = shape in lm_heads and num_down >= config.num_layers
            label = "lm_head" if is_lm_head else layers.get(shape) if shape else None
            num_down += label == "down_proj"
        if label is None:
            labels.append(region)
            continue
        labels.append(label)
        if label == "down_proj" and num_down >= config.num_layers:
            region = "lm_head"  # the rows that need logits are gathered, then the final norm
        elif label in REGION_AFTER:
            region = REGION_AFTER[label]
    for i in range(len(events) - 1):  # the weight's transposed view belongs to its matmul
        if events[i].name in TRANSPOSES and events[i + 1].name in MATMULS:
            labels[i] = labels[i + 1]
    return labels
