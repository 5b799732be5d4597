"""Profiler events of the CPU C++ extension (`kernels.cpu_extension`): each call of its matmul
(`kernels.cpu_gemv`) is the layer whose weight [out, in] it reads, as torch's matmuls are; its
per-layer ops (`kernels.cpu_layer_ops`) name themselves."""

from __future__ import annotations

import dataclasses

from llmbench.engine.presets import PRESETS
from llmbench.kernels import cpu_extension, cpu_quant_gemv
from llmbench.roofline.profile_ops import (
    CPU_EXTENSION_PREFIX,
    QUANT_MATMULS,
    QUANT_ROW_BLOCK,
    OpEvent,
    classify,
)

TINY = PRESETS["tiny"]  # h 64, q 64, kv 32, I 128, V 512, 2 layers
GEMV = "llmbench_cpu_ext_avx512bf16_0123456789ab::gemv"


def test_the_prefix_is_the_one_the_library_is_built_with():
    """profile_ops is torch-free, so it keeps its own copy of the library's name prefix."""
    assert CPU_EXTENSION_PREFIX == cpu_extension.LIBRARY_PREFIX
    assert GEMV.startswith(CPU_EXTENSION_PREFIX)
    # and of the int8/int4 matmuls' names and the rows their layouts pad to
    assert QUANT_MATMULS == (cpu_quant_gemv.OP, cpu_quant_gemv.GEMM_OP)
    assert QUANT_ROW_BLOCK == cpu_quant_gemv.ROW_BLOCK


def test_extension_calls_are_named_by_their_weight_shape():
    one_layer = [
        (OpEvent("aten::rms_norm", ((1, 64), (), (64,)), 1.0), "rms_norm"),
        (OpEvent(GEMV, ((1, 64), (128, 64), (), ()), 5.0), "qkv_proj"),
        (OpEvent("aten::mul", ((1, 6, 8), (1, 1, 8)), 1.0), "rope"),
        (OpEvent(GEMV, ((1, 64), (64, 64), (), (1, 64)), 4.0), "o_proj"),
        (OpEvent(GEMV, ((1, 64), (256, 64), (), ()), 6.0), "gate_up_proj"),
        (OpEvent("aten::silu", ((1, 128),), 1.0), "silu_mul"),
        (OpEvent(GEMV, ((1, 128), (64, 128), (), (1, 64)), 3.0), "down_proj"),
    ]
    lm_head = [(OpEvent(GEMV, ((1, 64), (512, 64), (), ()), 9.0), "lm_head")]
    events = one_layer * TINY.num_layers + lm_head
    assert classify([e for e, _ in events], TINY) == [label for _, label in events]


def test_extension_layer_ops_name_themselves():
    ns = GEMV.removesuffix("::gemv")
    one_layer = [
        (OpEvent(f"{ns}::rms_norm", ((1, 64), (64,), ()), 1.0), "rms_norm"),
        (OpEvent(GEMV, ((1, 64), (128, 64), (), ()), 5.0), "qkv_proj"),
        (OpEvent("aten::slice", ((1, 128),), 0.5), "rope"),
        (OpEvent(f"{ns}::rope_", ((1, 96), (1,), (256, 4, 2), ()), 1.0), "rope"),
        (OpEvent("aten::index_copy_", ((64, 2, 4, 8), (), (1,), (1, 2, 4, 8)), 1.0), "kv_write"),
        (OpEvent("aten::select", ((64, 2, 4, 8),), 0.5), "attention"),
        (OpEvent(f"{ns}::paged_decode_attention", ((1, 8, 8), (64, 4, 8)), 3.0), "attention"),
        (OpEvent(GEMV, ((1, 64), (64, 64), (), (1, 64)), 4.0), "o_proj"),
        (OpEvent(f"{ns}::rms_norm", ((1, 64), (64,), ()), 1.0), "rms_norm"),
        (OpEvent(GEMV, ((1, 64), (256, 64), (), ()), 6.0), "gate_up_proj"),
        (OpEvent("aten::silu", ((1, 128),), 1.0), "silu_mul"),
        (OpEvent(GEMV, ((1, 128), (64, 128), (), (1, 64)), 3.0), "down_proj"),
    ]
    final = [
        (OpEvent(f"{ns}::rms_norm", ((1, 64), (64,), ()), 1.0), "rms_norm"),
        (OpEvent(GEMV, ((1, 64), (512, 64), (), ()), 9.0), "lm_head"),
    ]
    events = one_layer * TINY.num_layers + final
    assert classify([e for e, _ in events], TINY) == [label for _, label in events]


def test_int8_int4_calls_are_named_by_x_and_their_padded_codes():
    """quant_gemv(x [M, K], codes [N/16, ·, 16, 4], ...): K from x, N as the codes hold it,
    rounded up to 16 rows. A vocabulary of 500 (not a multiple of 16) is 32 blocks (512 rows)
    of int8 codes (K/4 = 16 chunks a block); the layers' widths are whole blocks as they are."""
    config = dataclasses.replace(TINY, vocab_size=500)
    ns = GEMV.removesuffix("::gemv")
    quant = f"{ns}::quant_gemv"
    one_layer = [
        (OpEvent(quant, ((1, 64), (8, 8, 16, 4), (8, 2, 2, 16), ()), 5.0), "qkv_proj"),
        (OpEvent(quant, ((1, 64), (4, 8, 16, 4), (4, 2, 2, 16), ()), 4.0), "o_proj"),
        (
            OpEvent(f"{ns}::quant_gemm", ((9, 64), (16, 8, 16, 4), (16, 2, 2, 16)), 6.0),
            "gate_up_proj",
        ),
        (OpEvent(quant, ((1, 128), (4, 16, 16, 4), (4, 4, 2, 16), ()), 3.0), "down_proj"),
    ]
    lm_head = [(OpEvent(quant, ((1, 64), (32, 16, 16, 4), (), (512,)), 9.0), "lm_head")]
    events = one_layer * config.num_layers + lm_head
    assert classify([e for e, _ in events], config) == [label for _, label in events]
