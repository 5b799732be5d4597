"""int8 / int4 K/V quantise and dequantise: kernels, references, costs, checks.

One float16 scale per token and KV head (one row of d elements), symmetric:

    scale = float16(max(absmax(row) / qmax, 2^-24))        int8: qmax 127; int4: qmax 7
    code  = clamp(round_half_even(row / float32(scale)), -qmax, qmax)
    row'  = code · scale

int8 codes are stored as int8 [.., d]; int4 codes + 8 (1..15) as nibbles [.., d/2] (uint8),
element 2i in the low nibble and 2i + 1 in the high one. This is the engine's K/V storage
format; the torch references (`kv_quant_reference`, Triton-free, which the engine calls) are
the same arithmetic, and the tests hold the kernels and references bit-exact.
"""

from __future__ import annotations

import torch

from llmbench.kernels.checks import FLOAT_DTYPES, check_shape, check_tensor, check_value
from llmbench.kernels.cost import KernelCost, dtype_bytes
from llmbench.kernels.kv_quant_reference import (  # noqa: F401 (the references, re-exported)
    MIN_SCALE,
    QMAX,
    dequantize_reference,
    quantize_reference,
)
from llmbench.kernels.triton_support import check_launchable, next_power_of_2, tl, triton_kernel

OP_QUANTIZE = "kv_quantize"
OP_DEQUANTIZE = "kv_dequantize"
CODE_DTYPES = {"int8": torch.int8, "int4": torch.uint8}


@triton_kernel
def _quantize_kernel(
    x_ptr,
    x_token_stride,
    codes_ptr,
    scales_ptr,
    num_kv_heads,
    head_dim,
    QMAX: tl.constexpr,
    IS_INT4: tl.constexpr,
    BLOCK: tl.constexpr,
):
    # One program per row (token t, KV head j). int8: BLOCK covers d elements; int4: BLOCK
    # covers d/2 pairs, the even elements and the odd ones loaded as two tiles.
    row = tl.program_id(0).to(tl.int64)
    base = x_ptr + (row // num_kv_heads) * x_token_stride + (row % num_kv_heads) * head_dim
    i = tl.arange(0, BLOCK)
    if IS_INT4:
        mask = i < head_dim // 2
        x0 = tl.load(base + 2 * i, mask=mask, other=0.0).to(tl.float32)
        x1 = tl.load(base + 2 * i + 1, mask=mask, other=0.0).to(tl.float32)
        absmax = tl.maximum(tl.max(tl.abs(x0), axis=0), tl.max(tl.abs(x1), axis=0))
    else:
        mask = i < head_dim
        x0 = tl.load(base + i, mask=mask, other=0.0).to(tl.float32)
        x1 = x0
        absmax = tl.max(tl.abs(x0), axis=0)
    scale = tl.maximum(absmax / QMAX, 2.0**-24).to(tl.float16)
    tl.store(scales_ptr + row, scale)
    s = scale.to(tl.float32)
    # round half to even (torch.round): floor(y + 0.5), one down when that was an odd tie
    y0 = tl.math.div_rn(x0, s)
    r0 = tl.floor(y0 + 0.5)
    r0 = tl.where(((r0 - y0) == 0.5) & ((r0 - 2.0 * tl.floor(r0 * 0.5)) == 1.0), r0 - 1.0, r0)
    c0 = tl.minimum(tl.maximum(r0, -QMAX), QMAX)
    if IS_INT4:
        y1 = tl.math.div_rn(x1, s)
        r1 = tl.floor(y1 + 0.5)
        r1 = tl.where(((r1 - y1) == 0.5) & ((r1 - 2.0 * tl.floor(r1 * 0.5)) == 1.0), r1 - 1.0, r1)
        c1 = tl.minimum(tl.maximum(r1, -QMAX), QMAX)
        low = (c0 + 8.0).to(tl.int32)
        high = (c1 + 8.0).to(tl.int32)
        packed = (low | (high << 4)).to(tl.uint8)
        tl.store(codes_ptr + row * (head_dim // 2) + i, packed, mask=mask)
    else:
        tl.store(codes_ptr + row * head_dim + i, c0.to(tl.int8), mask=mask)


@triton_kernel
def _dequantize_kernel(
    codes_ptr,
    scales_ptr,
    out_ptr,
    head_dim,
    IS_INT4: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    i = tl.arange(0, BLOCK)
    out_type = out_ptr.dtype.element_ty
    # The scale is rounded to the output dtype first, as a multiply in that dtype would.
    s = tl.load(scales_ptr + row).to(out_type).to(tl.float32)
    if IS_INT4:
        mask = i < head_dim // 2
        packed = tl.load(codes_ptr + row * (head_dim // 2) + i, mask=mask, other=0).to(tl.int32)
        low = ((packed & 15) - 8).to(tl.float32)
        high = ((packed >> 4) - 8).to(tl.float32)
        tl.store(out_ptr + row * head_dim + 2 * i, (low * s).to(out_type), mask=mask)
        tl.store(out_ptr + row * head_dim + 2 * i + 1, (high * s).to(out_type), mask=mask)
    else:
        mask = i < head_dim
        codes = tl.load(codes_ptr + row * head_dim + i, mask=mask, other=0).to(tl.float32)
        tl.store(out_ptr + row * head_dim + i, (codes * s).to(out_type), mask=mask)


def _check_format(op: str, fmt: str, head_dim: int) -> None:
    check_value(op, fmt in QMAX, f"fmt {fmt!r}: use 'int8' or 'int4'")
    if fmt == "int4":
        check_value(
            op, head_dim % 2 == 0, f"int4 packs pairs: head_dim must be even, got {head_dim}"
        )


def quantize(x: torch.Tensor, fmt: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The Triton kernel: x [T, nkv, d] (tokens may be strided) → codes [T, nkv, d] int8 or
    [T, nkv, d/2] uint8 (int4), scales [T, nkv] float16."""
    check_tensor(OP_QUANTIZE, "x", x, "[T, nkv, d]", FLOAT_DTYPES, 2)
    num_tokens, num_kv_heads, head_dim = x.shape
    _check_format(OP_QUANTIZE, fmt, head_dim)
    check_launchable(OP_QUANTIZE, x.device.type)
    code_dim = head_dim // 2 if fmt == "int4" else head_dim
    codes = torch.empty(
        (num_tokens, num_kv_heads, code_dim), dtype=CODE_DTYPES[fmt], device=x.device
    )
    scales = torch.empty((num_tokens, num_kv_heads), dtype=torch.float16, device=x.device)
    if num_tokens * num_kv_heads == 0:
        return codes, scales
    _quantize_kernel[(num_tokens * num_kv_heads,)](
        x,
        x.stride(0),
        codes,
        scales,
        num_kv_heads,
        head_dim,
        QMAX=QMAX[fmt],
        IS_INT4=fmt == "int4",
        BLOCK=next_power_of_2(code_dim),
    )
    return codes, scales


def dequantize(
    codes: torch.Tensor, scales: torch.Tensor, fmt: str, dtype: torch.dtype
) -> torch.Tensor:
    """The Triton kernel: codes [T, nkv, d or d/2], scales [T, nkv] float16 (both contiguous)
    → values [T, nkv, d] in `dtype`."""
    op = OP_DEQUANTIZE
    check_value(op, fmt in QMAX, f"fmt {fmt!r}: use 'int8' or 'int4'")
    check_tensor(op, "codes", codes, "[T, nkv, d or d/2]", (CODE_DTYPES[fmt],), 3)
    num_tokens, num_kv_heads, code_dim = codes.shape
    check_tensor(op, "scales", scales, "[T, nkv]", (torch.float16,), 2, codes.device)
    check_shape(op, "scales", scales, (num_tokens, num_kv_heads), "[T, nkv]")
    check_value(op, dtype in FLOAT_DTYPES, f"dtype {dtype}: use float32, float16 or bfloat16")
    check_launchable(op, codes.device.type)
    head_dim = 2 * code_dim if fmt == "int4" else code_dim
    out = torch.empty((num_tokens, num_kv_heads, head_dim), dtype=dtype, device=codes.device)
    if num_tokens * num_kv_heads == 0:
        return out
    _dequantize_kernel[(num_tokens * num_kv_heads,)](
        codes, scales, out, head_dim, IS_INT4=fmt == "int4", BLOCK=next_power_of_2(code_dim)
    )
    return out


def quantize_cost(num_rows: int, head_dim: int, fmt: str, dtype: object) -> KernelCost:
    """Bytes and FLOPs of quantising R rows of d elements (R = tokens · KV heads).

    Formula: bytes = R·d·b (read) + R·d·bits/8 (codes) + 2·R (float16 scales);
             flops = 3·R·d (|x| and the running max, x / scale); rounding, clamping and
             packing are not counted.
    """
    elements = num_rows * head_dim
    num_bytes = elements * dtype_bytes(dtype) + elements * dtype_bytes(fmt) + 2 * num_rows
    return KernelCost(int(num_bytes), 3 * elements)


def dequantize_cost(num_rows: int, head_dim: int, fmt: str, dtype: object) -> KernelCost:
    """Bytes and FLOPs of dequantising R rows of d elements.

    Formula: bytes = R·d·bits/8 (codes) + 2·R (scales) + R·d·b (write);
             flops = R·d (code × scale), 2·R·d for int4 (the − 8 offset too).
    """
    elements = num_rows * head_dim
    num_bytes = elements * dtype_bytes(fmt) + 2 * num_rows + elements * dtype_bytes(dtype)
    return KernelCost(int(num_bytes), elements * (2 if fmt == "int4" else 1))
