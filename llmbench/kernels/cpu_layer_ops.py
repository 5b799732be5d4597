"""The per-layer ops of a CPU step through the C++ extension (`csrc/layer_ops.cpp`): RMSNorm,
RoPE in place, SwiGLU's silu(gate) · up, paged decode attention — checked, then called.

They live in the library `cpu_extension` builds and loads (one build, one provenance line) and take
the same arguments as the Triton kernels of the same names, so each is checked against the same
torch reference (`rms_norm_reference`, `rope_reference_`, `silu_and_mul_reference`,
`paged_decode_attention_reference`) and costed by the same cost function. The engine calls them
on CPU when the extension is in use (`LLMBENCH_CPU_EXTENSION` decides, as for the matmul).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from llmbench.kernels import cpu_prefill_attention
from llmbench.kernels.checks import (
    CPU,
    FLOAT_DTYPES,
    check_paged_cache,
    check_shape,
    check_tensor,
    check_value,
)
from llmbench.kernels.cpu_extension import CpuExtension

# The extension's op names. Not imported from the Triton kernel modules: importing one imports
# Triton, which this CPU path must not need (nor pay for).
DECODE_ATTENTION_OP = "paged_decode_attention"


def rms_norm(
    backend: CpuExtension, x: torch.Tensor, weight: torch.Tensor, eps: float
) -> torch.Tensor:
    """x [T, h] (rows contiguous) → x · rsqrt(mean(x²) + eps) · weight, in x's dtype."""
    op = "cpu rms_norm"
    check_tensor(op, "x", x, "[T, h]", FLOAT_DTYPES, device=CPU)
    check_tensor(op, "weight", weight, "[h]", (x.dtype,), contiguous_dims=1, device=CPU)
    check_shape(op, "weight", weight, (x.shape[1],), "[h]")
    return backend.op("rms_norm")(x, weight, eps)


def rope_(
    backend: CpuExtension,
    x: torch.Tensor,
    positions: torch.Tensor,
    cos_sin: torch.Tensor,
    head_dim: int,
) -> None:
    """Rotate x [T, heads·d] (interleaved pairs; rows may be strided) in place by the rows
    `positions` [T] (int64) of cos_sin [P, d/2, 2] float32 (cos, sin of each pair)."""
    op = "cpu rope_"
    check_tensor(op, "x", x, "[T, heads*d]", FLOAT_DTYPES, device=CPU)
    check_value(
        op,
        head_dim > 0 and head_dim % 2 == 0 and x.shape[1] % head_dim == 0,
        f"x's width {x.shape[1]} must be a multiple of an even head_dim, got {head_dim}",
    )
    check_tensor(op, "positions", positions, "[T]", (torch.int64,), contiguous_dims=1, device=CPU)
    check_shape(op, "positions", positions, (x.shape[0],), "[T]")
    check_tensor(
        op, "cos_sin", cos_sin, "[P, d/2, 2]", (torch.float32,), contiguous_dims=3, device=CPU
    )
    check_value(
        op,
        tuple(cos_sin.shape[1:]) == (head_dim // 2, 2),
        f"cos_sin must be [P, {head_dim // 2}, 2], got {tuple(cos_sin.shape)}",
    )
    backend.op("rope_")(x, positions, cos_sin, head_dim)


def silu_and_mul(backend: CpuExtension, gate_up: torch.Tensor) -> torch.Tensor:
    """gate_up [T, 2I] (rows contiguous) → silu(gate) · up [T, I] in float32, rounded once to
    gate_up's dtype (the Triton kernel `silu_and_mul`'s sums)."""
    op = "cpu silu_and_mul"
    check_tensor(op, "gate_up", gate_up, "[T, 2I]", FLOAT_DTYPES, device=CPU)
    width = gate_up.shape[1]
    check_value(op, width % 2 == 0, f"gate_up's width must be 2·I (even), got {width}")
    return backend.op("silu_and_mul")(gate_up)


def paged_decode_attention(
    backend: CpuExtension,
    q: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    block_size: int,
    scale: float,
    max_context_len: int,
) -> torch.Tensor:
    """q [B, nh, d] over the paged caches → [B, nh, d]: the Triton kernel's arguments
    (`kernels.decode_attention.paged_decode_attention`), block_tables [B, max_blocks] and
    context_lens [B] int32."""
    op = "cpu " + DECODE_ATTENTION_OP
    check_tensor(op, "q", q, "[B, nh, d]", FLOAT_DTYPES, 1, CPU)
    check_paged_cache(op, q, key_cache, value_cache)
    batch = q.shape[0]
    check_tensor(op, "block_tables", block_tables, "[B, max_blocks]", (torch.int32,), 2, CPU)
    check_shape(op, "block_tables", block_tables, (batch, block_tables.shape[1]), "[B, ...]")
    check_tensor(op, "context_lens", context_lens, "[B]", (torch.int32,), 1, CPU)
    check_shape(op, "context_lens", context_lens, (batch,), "[B]")
    check_value(op, block_size > 0, f"block_size must be > 0, got {block_size}")
    check_value(
        op,
        0 < max_context_len <= block_tables.shape[1] * block_size,
        f"max_context_len {max_context_len} must be in 1..max_blocks·block_size = "
        f"{block_tables.shape[1] * block_size}",
    )
    return backend.op(DECODE_ATTENTION_OP)(
        q, key_cache, value_cache, block_tables, context_lens, block_size, scale, max_context_len
    )


@dataclass(frozen=True)
class CpuLayerOps:
    """The library's per-layer ops resolved once, for a caller whose layouts are right by
    construction (the engine): called as the checked functions above, minus the backend."""

    rms_norm: Callable[..., torch.Tensor]
    rope_: Callable[..., None]
    silu_and_mul: Callable[..., torch.Tensor]
    paged_decode_attention: Callable[..., torch.Tensor]
    # A whole dense layer of a decode step (`csrc/decode_layer.cpp`): the model's ops in its
    # order, the matmuls through the library's `gemv` or `quant_gemv` (`quant_gemm` above its
    # rows); see `LlamaModel.forward`. `decode_layers`: every layer of the model in one call.
    decode_layer: Callable[..., torch.Tensor]
    decode_layers: Callable[..., torch.Tensor]
    # A prompt chunk's causal attention on AMX tiles or AVX-512 BF16 vectors
    # (`kernels.cpu_prefill_attention`), where the build has them and the model's head_dim fits;
    # else None (torch's SDPA).
    prefill_attention: Callable[..., torch.Tensor] | None = None

    @classmethod
    def of(cls, backend: CpuExtension, head_dim: int) -> CpuLayerOps:
        prefill = cpu_prefill_attention.available(backend, head_dim)
        return cls(
            backend.op("rms_norm"),
            backend.op("rope_"),
            backend.op("silu_and_mul"),
            backend.op(DECODE_ATTENTION_OP),
            backend.op("decode_layer"),
            backend.op("decode_layers"),
            backend.op(cpu_prefill_attention.OP) if prefill else None,
        )
