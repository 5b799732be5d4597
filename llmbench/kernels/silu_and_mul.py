"""SwiGLU's activation: silu(gate) · up from a fused [T, 2I] gate_up: kernel, reference, cost.

    out[t, j] = silu(g) · u,  g = gate_up[t, j], u = gate_up[t, I + j],  silu(g) = g / (1 + e^-g)

Computed in float32, rounded once to the input's dtype.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from llmbench.kernels.checks import FLOAT_DTYPES, check_shape, check_tensor, check_value
from llmbench.kernels.cost import KernelCost, dtype_bytes
from llmbench.kernels.triton_support import check_launchable, next_power_of_2, tl, triton_kernel

OP = "silu_and_mul"
BLOCK = 1024  # columns per program


@triton_kernel
def _silu_and_mul_kernel(
    gate_up_ptr,
    gate_up_row_stride,
    out_ptr,
    out_row_stride,
    intermediate,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < intermediate
    gate_ptrs = gate_up_ptr + row * gate_up_row_stride + cols
    g = tl.load(gate_ptrs, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(gate_ptrs + intermediate, mask=mask, other=0.0).to(tl.float32)
    y = g / (1.0 + tl.exp(-g)) * u
    tl.store(out_ptr + row * out_row_stride + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


def silu_and_mul_reference(gate_up: torch.Tensor) -> torch.Tensor:
    """gate_up [T, 2I] → [T, I] in gate_up's dtype."""
    gate, up = gate_up.float().chunk(2, dim=-1)
    return (F.silu(gate) * up).to(gate_up.dtype)


def silu_and_mul(gate_up: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """The Triton kernel: gate_up [T, 2I] (rows may be strided) → out [T, I]."""
    check_tensor(OP, "gate_up", gate_up, "[T, 2I]", FLOAT_DTYPES)
    num_tokens, width = gate_up.shape
    check_value(OP, width % 2 == 0, f"gate_up's width must be 2·I (even), got {width}")
    intermediate = width // 2
    if out is None:
        out = torch.empty((num_tokens, intermediate), dtype=gate_up.dtype, device=gate_up.device)
    check_tensor(OP, "out", out, "[T, I]", (gate_up.dtype,), device=gate_up.device)
    check_shape(OP, "out", out, (num_tokens, intermediate), "[T, I]")
    check_launchable(OP, gate_up.device.type)
    if num_tokens == 0 or intermediate == 0:
        return out
    block = min(BLOCK, next_power_of_2(intermediate))
    grid = (num_tokens, -(-intermediate // block))
    _silu_and_mul_kernel[grid](
        gate_up, gate_up.stride(0), out, out.stride(0), intermediate, BLOCK=block
    )
    return out


def silu_and_mul_cost(num_tokens: int, intermediate: int, dtype: object) -> KernelCost:
    """Bytes and FLOPs of one launch, gate_up [T, 2I] → [T, I].

    Formula: bytes = 3·T·I·b (read gate and up, write out);
             flops = 5·T·I (negate, exp, +1, divide: silu; × up), e^x counted as one FLOP.
    """
    elements = num_tokens * intermediate
    return KernelCost(int(3 * elements * dtype_bytes(dtype)), 5 * elements)
