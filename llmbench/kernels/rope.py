"""Rotary position embedding, in place, on interleaved pairs: kernel, reference, cost, checks.

Each head's d dims are d/2 pairs (x[2i], x[2i+1]) (the layout the engine stores q/k in after
reordering HF's half-split rows), rotated by the angle pos·inv_freq[i]:

    x[2i]'   = x[2i]·cos − x[2i+1]·sin
    x[2i+1]' = x[2i]·sin + x[2i+1]·cos

The caller passes cos and sin tables [P, d/2] (float32) for positions 0..P-1, computed from its
inv_freq, so any frequency scaling (Llama-3's long-context one) is already in them. Computed in
float32, rounded once to x's dtype.
"""

from __future__ import annotations

import torch

from llmbench.kernels.checks import (
    FLOAT_DTYPES,
    INDEX_DTYPES,
    check_shape,
    check_tensor,
    check_value,
)
from llmbench.kernels.cost import KernelCost, dtype_bytes
from llmbench.kernels.triton_support import check_launchable, next_power_of_2, tl, triton_kernel

OP = "rope"


@triton_kernel
def _rope_kernel(
    x_ptr,
    x_row_stride,
    positions_ptr,
    cos_ptr,
    sin_ptr,
    num_heads,
    HEAD_DIM: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_PAIRS: tl.constexpr,
):
    # Program (token, head block): BLOCK_H heads × d/2 pairs of one token.
    row = tl.program_id(0).to(tl.int64)
    heads = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    pairs = tl.arange(0, BLOCK_PAIRS)
    half = HEAD_DIM // 2  # a constexpr: HEAD_DIM is one
    pair_mask = pairs < half
    pos = tl.load(positions_ptr + row).to(tl.int64)
    cos = tl.load(cos_ptr + pos * half + pairs, mask=pair_mask, other=0.0)[None, :]
    sin = tl.load(sin_ptr + pos * half + pairs, mask=pair_mask, other=0.0)[None, :]
    mask = (heads < num_heads)[:, None] & pair_mask[None, :]
    even_ptrs = x_ptr + row * x_row_stride + heads[:, None] * HEAD_DIM + 2 * pairs[None, :]
    x0 = tl.load(even_ptrs, mask=mask, other=0.0).to(tl.float32)
    x1 = tl.load(even_ptrs + 1, mask=mask, other=0.0).to(tl.float32)
    out_type = x_ptr.dtype.element_ty
    tl.store(even_ptrs, (x0 * cos - x1 * sin).to(out_type), mask=mask)
    tl.store(even_ptrs + 1, (x0 * sin + x1 * cos).to(out_type), mask=mask)


def cos_sin_tables(inv_freq: torch.Tensor, num_positions: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of pos·inv_freq[i] for positions 0..P-1: two float32 [P, d/2] tables."""
    t = torch.arange(num_positions, dtype=torch.float32, device=inv_freq.device)
    angles = torch.outer(t, inv_freq.float())
    return torch.cos(angles), torch.sin(angles)


def rope_reference_(
    x: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, head_dim: int
) -> None:
    """Rotate x [T, heads·d] (interleaved pairs) in place by the rows `positions` [T] of cos,
    sin [P, d/2]."""
    pairs = x.view(x.shape[0], -1, head_dim // 2, 2).float()  # [T, heads, d/2, 2]
    c, s = cos[positions][:, None, :], sin[positions][:, None, :]  # [T, 1, d/2]
    x0, x1 = pairs[..., 0], pairs[..., 1]
    rotated = torch.stack((x0 * c - x1 * s, x0 * s + x1 * c), dim=-1)
    x.copy_(rotated.view(x.shape).to(x.dtype))


def rope_(
    x: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, head_dim: int
) -> None:
    """The Triton kernel: rotate x [T, heads·d] in place (rows may be strided, e.g. the q and
    k columns of a fused qkv matrix) by positions [T] of cos, sin [P, d/2] float32."""
    check_tensor(OP, "x", x, "[T, heads*d]", FLOAT_DTYPES)
    num_tokens, width = x.shape
    check_value(
        OP,
        head_dim > 0 and head_dim % 2 == 0 and width % head_dim == 0,
        f"x's width {width} must be a multiple of an even head_dim, got head_dim {head_dim}",
    )
    check_tensor(OP, "positions", positions, "[T]", INDEX_DTYPES, device=x.device)
    check_shape(OP, "positions", positions, (num_tokens,), "[T]")
    for name, table in (("cos", cos), ("sin", sin)):
        check_tensor(OP, name, table, "[P, d/2]", (torch.float32,), 2, device=x.device)
        check_value(
            OP,
            table.shape[1] == head_dim // 2,
            f"{name} must be [P, d/2] = [P, {head_dim // 2}], got {tuple(table.shape)}",
        )
    check_shape(OP, "sin", sin, tuple(cos.shape), "cos's [P, d/2]")
    check_launchable(OP, x.device.type)
    if num_tokens == 0:
        return
    num_heads = width // head_dim
    block_h = min(next_power_of_2(num_heads), 16)
    grid = (num_tokens, -(-num_heads // block_h))
    _rope_kernel[grid](
        x,
        x.stride(0),
        positions,
        cos,
        sin,
        num_heads,
        HEAD_DIM=head_dim,
        BLOCK_H=block_h,
        BLOCK_PAIRS=next_power_of_2(head_dim // 2),
    )


def rope_cost(
    num_tokens: int, width: int, head_dim: int, dtype: object, index_dtype: object = "int64"
) -> KernelCost:
    """Bytes and FLOPs of one launch over x [T, W] (W = heads·d).

    Formula: bytes = 2·T·W·b (read and write x) + 2·T·(d/2)·4 (one cos and one sin row per
                     token, float32) + T·b_index (positions);
             flops = 3·T·W (per pair: 4 multiplies, 2 adds, for 2 elements).
    """
    b = dtype_bytes(dtype)
    num_bytes = 2 * num_tokens * width * b
    num_bytes += 2 * num_tokens * (head_dim // 2) * 4 + num_tokens * dtype_bytes(index_dtype)
    return KernelCost(int(num_bytes), 3 * num_tokens * width)
