"""RMSNorm over rows, optionally fused with the residual add: kernel, reference, cost, checks.

    out = weight · y / sqrt(mean(y²) + eps),   y = x                     (no residual)
                                                y = round(x + residual)   (fused: residual ← y)

Statistics and the product are computed in float32 and rounded once to x's dtype. With a
residual, the sum is rounded to the dtype first and written back into `residual` (the residual
stream the next block adds to), then normalised: the same numbers as an add followed by a norm.
"""

from __future__ import annotations

import torch

from llmbench.kernels.checks import FLOAT_DTYPES, check_same_dtype, check_shape, check_tensor
from llmbench.kernels.cost import KernelCost, dtype_bytes
from llmbench.kernels.triton_support import check_launchable, next_power_of_2, tl, triton_kernel

OP = "rms_norm"


@triton_kernel
def _rms_norm_kernel(
    x_ptr,
    x_row_stride,
    residual_ptr,
    residual_row_stride,
    weight_ptr,
    out_ptr,
    out_row_stride,
    hidden,
    eps,
    HAS_RESIDUAL: tl.constexpr,
    BLOCK: tl.constexpr,
):
    # One program per row; the whole row is one tile (BLOCK >= hidden).
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < hidden
    x = tl.load(x_ptr + row * x_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        r_ptrs = residual_ptr + row * residual_row_stride + cols
        r = tl.load(r_ptrs, mask=mask, other=0.0).to(tl.float32)
        summed = (x + r).to(residual_ptr.dtype.element_ty)  # rounded like an unfused add
        tl.store(r_ptrs, summed, mask=mask)
        x = summed.to(tl.float32)
    mean_square = tl.sum(x * x, axis=0) / hidden
    rstd = 1.0 / tl.sqrt(mean_square + eps)
    w = tl.load(weight_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    y = x * rstd * w
    tl.store(out_ptr + row * out_row_stride + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


def rms_norm_reference(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> torch.Tensor:
    """x: [T, h], weight: [h] → [T, h] in x's dtype; `residual` [T, h] ← x + residual first."""
    if residual is not None:
        residual.copy_((x.float() + residual.float()).to(residual.dtype))
        x = residual
    xf = x.float()
    rstd = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (xf * rstd * weight.float()).to(x.dtype)


def rms_norm(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    residual: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """The Triton kernel: x [T, h] (rows may be strided), weight [h] → out [T, h]; with
    `residual` [T, h], residual ← x + residual and out = norm(residual)."""
    check_tensor(OP, "x", x, "[T, h]", FLOAT_DTYPES)
    num_tokens, hidden = x.shape
    check_tensor(OP, "weight", weight, "[h]", FLOAT_DTYPES, device=x.device)
    check_shape(OP, "weight", weight, (hidden,), "[h]")
    if residual is not None:
        check_tensor(OP, "residual", residual, "[T, h]", FLOAT_DTYPES, device=x.device)
        check_shape(OP, "residual", residual, (num_tokens, hidden), "[T, h]")
        check_same_dtype(OP, "residual", residual, "x", x.dtype)
    if out is None:
        out = torch.empty((num_tokens, hidden), dtype=x.dtype, device=x.device)
    check_tensor(OP, "out", out, "[T, h]", (x.dtype,), device=x.device)
    check_shape(OP, "out", out, (num_tokens, hidden), "[T, h]")
    check_launchable(OP, x.device.type)
    if num_tokens == 0:
        return out
    _rms_norm_kernel[(num_tokens,)](
        x,
        x.stride(0),
        residual if residual is not None else x,
        residual.stride(0) if residual is not None else 0,
        weight,
        out,
        out.stride(0),
        hidden,
        float(eps),
        HAS_RESIDUAL=residual is not None,
        BLOCK=next_power_of_2(hidden),
    )
    return out


def rms_norm_cost(
    num_tokens: int,
    hidden: int,
    dtype: object,
    weight_dtype: object | None = None,
    has_residual: bool = False,
) -> KernelCost:
    """Bytes and FLOPs of one launch over [T, h].

    Formula: bytes = 2·T·h·b (read x, write out) + h·b_w (weight)
                     + 2·T·h·b with a residual (read it, write it back);
             flops = 4·T·h (square, sum, ×rstd, ×weight) + T·h with a residual (the add).
    The per-row mean and rsqrt (2·T) are left out.
    """
    b = dtype_bytes(dtype)
    b_w = dtype_bytes(weight_dtype if weight_dtype is not None else dtype)
    elements = num_tokens * hidden
    num_bytes = 2 * elements * b + hidden * b_w
    flops = 4 * elements
    if has_residual:
        num_bytes += 2 * elements * b
        flops += elements
    return KernelCost(int(num_bytes), int(flops))
