"""int8 and int4 matmuls on AVX-512 VNNI and AVX2 CPUs through the C++ extension
(`csrc/gemv_quant.cpp`): the weight layouts it reads, the exact references, cost and checks.

    y[M, N] = x[M, K] @ dequant(W)[N, K]^T (+ bias) (+ residual), y in x's dtype

Two ops read the layouts. `quant_gemv` (decode: a few rows) quantises x; `quant_gemm` (prefill:
many rows) is weight-only, x kept as it is: bfloat16 x meets W dequantised to bfloat16 one block
of 16 rows at a time in cache (`csrc/gemm_panels.h`), on the AMX tiles (`csrc/gemv_amx.cpp`) or
on AVX-512 BF16 vectors (`csrc/gemm_vectors.cpp`) or, on AVX2, into float32 panels met on FMAs
(`csrc/gemm_float32_panels.cpp`); float32 or float16 x: W is dequantised whole to x's dtype
(`quant_dequantize`) for one oneDNN addmm. Bias and residual are added before y is rounded;
`quant_gemm_reference` is that product in float64.

In `quant_gemv`, x is quantised per call to int8 in groups of 32 along K (scale max|x| / 127),
as llama.cpp quantises activations for its Q4/Q8 dot products, so the codes multiply with
VPDPBUSD (16 lanes of 4 byte products an instruction) or, on AVX2, with VPMADDUBSW and VPMADDWD
(the same int32 sums); each group's int32 sum is scaled in float32.
`quant_gemv_reference` computes the same sums exactly in float64, so the kernel matches it to
float32 rounding; what quantising x costs in quality is `llmbench quality`'s to measure (against
the weights' own dequantised product, `dequantize_int4_blocks` / `dequantize_int8_blocks`).

Layouts (rows in blocks of 16, one per 32-bit lane; a lane's 4 bytes are 4 consecutive k, which
meet x's 4 codes at those k, broadcast to every lane):
    int4 (group 32, zero point): codes [N/16, K/8, 16, 4] uint8, chunk t, lane i, byte j =
         q[16b + i, 8t + j] | q[16b + i, 8t + 4 + j] << 4; scale_zero [N/16, K/32, 2, 16]
         float16 (the 16 rows' scales, then their zero points); w = s·(q − 8) + z
    int8 (per output channel): codes [N/16, K/4, 16, 4] int8, chunk t, lane i, byte j =
         q[16b + i, 4t + j]; scale [N_padded] float32; w = s·q
N is padded to a multiple of 16 (rows of zeros, scale 0), K to a multiple of 32 (code columns
the kernel meets with x's zero padding).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from llmbench.kernels.checks import (
    CPU,
    FLOAT_DTYPES,
    check_bias_and_residual,
    check_shape,
    check_tensor,
    check_value,
)
from llmbench.kernels.cost import KernelCost, dtype_bytes
from llmbench.kernels.cpu_extension import CpuExtension

OP = "quant_gemv"
GEMM_OP = "quant_gemm"  # weight-only, for many rows
DEQUANTIZE_OP = "quant_dequantize"  # the layouts back to W [N, K] in a float dtype
GROUP = 32  # x's quantisation group along K, and int4's weight group
ROW_BLOCK = 16  # rows of W per block: one per 32-bit lane of a VPDPBUSD
INT4_OFFSET = 8


def _pad_to(t: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """t [n, k] padded with zeros to [rows, cols]."""
    return F.pad(t, (0, cols - t.shape[1], 0, rows - t.shape[0]))


def _padded_sizes(out_features: int, in_features: int) -> tuple[int, int]:
    return -(-out_features // ROW_BLOCK) * ROW_BLOCK, -(-in_features // GROUP) * GROUP


def pack_int4(
    codes: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """codes uint8 [N, K] (0..15), scale and zero [N, ceil(K/32)] (float16-representable) →
    (codes [N/16, K/8, 16, 4] uint8, scale_zero [N/16, K/32, 2, 16] float16)."""
    n, k = codes.shape
    rows, cols = _padded_sizes(n, k)
    groups = cols // GROUP
    q = _pad_to(codes, rows, cols).view(rows // ROW_BLOCK, ROW_BLOCK, cols // 8, 2, 4)
    packed = (q[:, :, :, 0] | (q[:, :, :, 1] << 4)).permute(0, 2, 1, 3)  # [N/16, K/8, 16, 4]
    scale_zero = torch.stack(
        [_pad_to(t.to(torch.float16), rows, groups) for t in (scale, zero)], dim=0
    )  # [2, N, G]
    scale_zero = scale_zero.view(2, rows // ROW_BLOCK, ROW_BLOCK, groups).permute(1, 3, 0, 2)
    return packed.contiguous(), scale_zero.contiguous()


def pack_int8(codes: torch.Tensor, scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """codes int8 [N, K], scale [N] → (codes [N/16, K/4, 16, 4] int8, scale [N/16·16] float32)."""
    n, k = codes.shape
    rows, cols = _padded_sizes(n, k)
    q = _pad_to(codes, rows, cols).view(rows // ROW_BLOCK, ROW_BLOCK, cols // 4, 4)
    scale = F.pad(scale.float(), (0, rows - n))
    return q.permute(0, 2, 1, 3).contiguous(), scale


def unpack_int4_blocks(
    packed: torch.Tensor, scale_zero: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The int4 layout as rows: (codes q [N_pad, G, 32] uint8, scale s and zero z [N_pad, G]
    float16)."""
    q = torch.stack((packed & 15, packed >> 4), dim=3)  # [N/16, K/8, 16, 2, 4]
    q = q.permute(0, 2, 1, 3, 4).reshape(-1, scale_zero.shape[1], GROUP)
    s, z = (scale_zero[:, :, i].permute(0, 2, 1).reshape(q.shape[:2]) for i in (0, 1))
    return q, s, z


def unpack_int8_blocks(codes: torch.Tensor) -> torch.Tensor:
    """The int8 layout as rows: codes [N_pad, G, 32] int8."""
    return codes.permute(0, 2, 1, 3).reshape(codes.shape[0] * ROW_BLOCK, -1, GROUP)


def dequantize_int4_blocks(
    packed: torch.Tensor, scale_zero: torch.Tensor, out_features: int, in_features: int
) -> torch.Tensor:
    """The int4 layout back to W [N, K] in float32: s·(q − 8) + z per group."""
    q, s, z = unpack_int4_blocks(packed, scale_zero)
    w = (q.float() - INT4_OFFSET) * s.float()[..., None] + z.float()[..., None]  # [N_pad, G, 32]
    return w.view(q.shape[0], -1)[:out_features, :in_features]


def dequantize_int8_blocks(
    codes: torch.Tensor, scale: torch.Tensor, out_features: int, in_features: int
) -> torch.Tensor:
    """The int8 layout back to W [N, K] in float32: s·q per row."""
    q = unpack_int8_blocks(codes).flatten(1).float()
    return (q * scale[:, None])[:out_features, :in_features]


def quantize_activations(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x [M, K] → (xq [M, G, 32], sx [M, G], Σx [M, G]) in float64, as the kernel makes them in
    float32: sx = max|x| / 127 per group of 32, xq = round(x · (127 / max|x|)) (half to even;
    0 where the group is all zeros); K padded with zeros to whole groups."""
    xf = x.float()
    xf = F.pad(xf, (0, -(-xf.shape[1] // GROUP) * GROUP - xf.shape[1]))
    groups = xf.view(xf.shape[0], -1, GROUP)
    amax = groups.abs().amax(dim=2)
    inv = torch.where(amax > 0, 127.0 / amax, torch.zeros_like(amax))
    xq = torch.round(groups * inv[..., None])
    return xq.double(), (amax / 127.0).double(), groups.double().sum(dim=2)


def quant_gemv_reference(
    x: torch.Tensor,
    codes: torch.Tensor,
    scale_zero: torch.Tensor | None,
    scale: torch.Tensor | None,
    out_features: int,
    bias: torch.Tensor | None = None,
    residual: torch.Tensor | None = None,
) -> torch.Tensor:
    """The kernel's result computed exactly (float64 from the same integer sums), rounded once
    to x's dtype: int4 Σ_g [s·sx·Σ q·xq + (z − 8s)·Σx], int8 s·Σ_g sx·Σ q·xq."""
    xq, sx, xsum = quantize_activations(x)  # [M, G, 32], [M, G], [M, G]
    if scale_zero is not None:
        q, s, z = (t.double() for t in unpack_int4_blocks(codes, scale_zero))  # [N_pad, G(, 32)]
        dots = torch.einsum("mgk,ngk->mng", xq, q)  # exact integers
        y = (dots * s[None] * sx[:, None]).sum(-1) + ((z - 8 * s)[None] * xsum[:, None]).sum(-1)
    else:
        dots = torch.einsum("mgk,ngk->mng", xq, unpack_int8_blocks(codes).double())
        y = (dots * sx[:, None]).sum(-1) * scale.double()[None]
    return _finished(y[:, :out_features], bias, residual, x.dtype)


def quant_gemm_reference(
    x: torch.Tensor,
    codes: torch.Tensor,
    scale_zero: torch.Tensor | None,
    scale: torch.Tensor | None,
    out_features: int,
    bias: torch.Tensor | None = None,
    residual: torch.Tensor | None = None,
) -> torch.Tensor:
    """`quant_gemm`'s product in float64, rounded once to x's dtype: x times W dequantised in
    float32 (`dequantize_int4_blocks` / `dequantize_int8_blocks`) and rounded to x's dtype, as
    the op multiplies it."""
    k = x.shape[1]
    if scale_zero is not None:
        w = dequantize_int4_blocks(codes, scale_zero, out_features, k)
    else:
        w = dequantize_int8_blocks(codes, scale, out_features, k)
    return _finished(x.double() @ w.to(x.dtype).double().t(), bias, residual, x.dtype)


def _finished(
    y: torch.Tensor, bias: torch.Tensor | None, residual: torch.Tensor | None, dtype: torch.dtype
) -> torch.Tensor:
    """A reference's float64 y [M, N] plus the bias and the residual, rounded once to dtype."""
    if bias is not None:
        y = y + bias.double()
    if residual is not None:
        y = y + residual.double()
    return y.to(dtype)


def check_quant_gemv_args(
    x: torch.Tensor,
    codes: torch.Tensor,
    scale_zero: torch.Tensor | None,
    scale: torch.Tensor | None,
    out_features: int,
    bias: torch.Tensor | None = None,
    residual: torch.Tensor | None = None,
) -> None:
    """Raise KernelArgumentError naming the argument unless the layout is what the op reads."""
    check_value(OP, (scale_zero is None) != (scale is None), "give scale_zero (int4) or scale")
    check_tensor(OP, "x", x, "[M, K]", FLOAT_DTYPES, device=CPU)
    if scale_zero is not None:
        check_tensor(OP, "codes", codes, "[N/16, K/8, 16, 4]", (torch.uint8,), 4, CPU)
        check_shape(OP, "codes", codes, (*codes.shape[:2], ROW_BLOCK, 4), "[N/16, K/8, 16, 4]")
        groups = codes.shape[1] // (GROUP // 8)
        check_value(OP, codes.shape[1] % 4 == 0, "codes must cover whole groups of 32 along K")
        check_tensor(OP, "scale_zero", scale_zero, "[N/16, K/32, 2, 16]", (torch.float16,), 4, CPU)
        expected = (codes.shape[0], groups, 2, ROW_BLOCK)
        check_shape(OP, "scale_zero", scale_zero, expected, "[N/16, K/32, 2, 16]")
    else:
        check_tensor(OP, "codes", codes, "[N/16, K/4, 16, 4]", (torch.int8,), 4, CPU)
        check_shape(OP, "codes", codes, (*codes.shape[:2], ROW_BLOCK, 4), "[N/16, K/4, 16, 4]")
        groups = codes.shape[1] // (GROUP // 4)
        check_value(OP, codes.shape[1] % 8 == 0, "codes must cover whole groups of 32 along K")
        check_tensor(OP, "scale", scale, "[N]", (torch.float32,), 1, CPU)
        check_shape(OP, "scale", scale, (codes.shape[0] * ROW_BLOCK,), "[N/16·16]")
    blocks = codes.shape[0]
    check_value(
        OP,
        0 < out_features <= blocks * ROW_BLOCK and x.shape[1] <= groups * GROUP,
        f"codes {tuple(codes.shape)} do not cover [out_features {out_features}, K {x.shape[1]}]",
    )
    check_bias_and_residual(OP, x, out_features, bias, residual)


def _check_has_kernel(backend: CpuExtension) -> None:
    message = f"the extension ({backend.describe()}) has no int8/int4 kernel (a scalar build)"
    check_value(OP, backend.has_quant_gemv, message)


def quant_gemv(
    backend: CpuExtension,
    x: torch.Tensor,
    codes: torch.Tensor,
    scale_zero: torch.Tensor | None,
    scale: torch.Tensor | None,
    out_features: int,
    bias: torch.Tensor | None = None,
    residual: torch.Tensor | None = None,
    op: str = OP,
) -> torch.Tensor:
    """x [M, K] @ dequant(W)^T (+ bias) (+ residual) → [M, N] through the extension, checked:
    `op` OP (x quantised per group of 32) or GEMM_OP (weight-only)."""
    check_quant_gemv_args(x, codes, scale_zero, scale, out_features, bias, residual)
    _check_has_kernel(backend)
    return backend.op(op)(x, codes, scale_zero, scale, out_features, bias, residual)


def dequantize(
    backend: CpuExtension,
    codes: torch.Tensor,
    scale_zero: torch.Tensor | None,
    scale: torch.Tensor | None,
    out_features: int,
    in_features: int,
    dtype: torch.dtype,
) -> torch.Tensor:
    """The layout back to W [out_features, in_features] in `dtype` through the extension,
    checked: `dequantize_int4_blocks` / `dequantize_int8_blocks` rounded once to `dtype`."""
    x = torch.empty(1, in_features, dtype=dtype)  # stands for the rows W would multiply
    check_quant_gemv_args(x, codes, scale_zero, scale, out_features)
    _check_has_kernel(backend)
    return backend.op(DEQUANTIZE_OP)(codes, scale_zero, scale, out_features, in_features, dtype)


def quant_gemv_cost(
    num_rows: int, out_features: int, in_features: int, bits: int, dtype: object
) -> KernelCost:
    """Bytes and FLOPs of one call of either op (W read once: `quant_gemm` dequantises each
    block once a call and keeps it in cache for every row).

    Formula: bytes = N·K·bits/8 + scales (int4: 4 bytes per 32 weights; int8: 4 per row)
    + e·(M·K + M·N), flops = 2·M·N·K, e the bytes per element of x's dtype.
    """
    n, k, m = out_features, in_features, num_rows
    weights = n * k * bits // 8 + (n * -(-k // GROUP) * 4 if bits == 4 else n * 4)
    return KernelCost(int(weights + dtype_bytes(dtype) * (m * k + m * n)), 2 * m * n * k)
