"""llmbench.kernels.silu_and_mul: the Triton kernel against its reference, the reference
against the engine's SwiGLU activation, the cost by hand, and the layout errors."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from llmbench.kernels.cost import KernelCost
from llmbench.kernels.errors import KernelArgumentError
from llmbench.kernels.silu_and_mul import silu_and_mul, silu_and_mul_cost, silu_and_mul_reference

TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}


def gate_up(num_tokens, intermediate, dtype, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(num_tokens, 2 * intermediate, generator=g) * 4).to(dtype).to(device)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize(("num_tokens", "intermediate"), [(1, 128), (5, 1500)])
def test_kernel_matches_reference(dtype, num_tokens, intermediate, device):
    x = gate_up(num_tokens, intermediate, dtype, device)
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(silu_and_mul(x), silu_and_mul_reference(x), atol=tol, rtol=tol)


def test_strided_rows_and_a_given_output(device):
    wide = gate_up(3, 40, torch.float32, device)
    x = wide[:, :60]  # rows strided: 2I = 60 of 80 columns
    out = torch.empty(3, 30, device=device)
    assert silu_and_mul(x, out=out) is out
    torch.testing.assert_close(out, silu_and_mul_reference(x))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_reference_matches_the_engines_activation(dtype):
    x = gate_up(4, 64, dtype, torch.device("cpu"))
    engine = F.silu(x[:, :64]) * x[:, 64:]  # what model.py computes on its torch path
    tol = 2 * TOLERANCE[dtype]  # the engine rounds silu(g) before the product
    torch.testing.assert_close(silu_and_mul_reference(x), engine, atol=tol, rtol=tol)


def test_cost_by_hand():
    # T = 2, I = 10, bfloat16: read gate and up 2·2·10·2 = 80 B, write 2·10·2 = 40 B → 120 B;
    # FLOPs 5 per output (negate, exp, +1, divide, × up) · 20 outputs = 100.
    assert silu_and_mul_cost(2, 10, "bfloat16") == KernelCost(bytes=120, flops=100)


def test_layout_errors_are_one_line(device):
    with pytest.raises(KernelArgumentError, match=r"silu_and_mul: gate_up's width must be 2·I"):
        silu_and_mul(torch.randn(2, 7, device=device))
    with pytest.raises(KernelArgumentError, match="silu_and_mul: gate_up must be contiguous in"):
        silu_and_mul(torch.randn(8, 2, device=device).t())
    with pytest.raises(KernelArgumentError, match=r"silu_and_mul: out must have shape \[T, I\]"):
        silu_and_mul(torch.randn(2, 8, device=device), out=torch.empty(2, 8, device=device))
    with pytest.raises(KernelArgumentError, match="silu_and_mul: out has dtype float16; pass fl"):
        silu_and_mul(torch.randn(2, 8, device=device), out=torch.empty(2, 4).half().to(device))
