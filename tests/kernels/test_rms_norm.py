"""llmbench.kernels.rms_norm: the Triton kernel against its reference, the reference against
the engine's RMSNorm, the cost by hand, and the launcher's layout errors."""

from __future__ import annotations

import pytest
import torch

from llmbench.engine.model import rms_norm as engine_rms_norm
from llmbench.kernels.cost import KernelCost
from llmbench.kernels.errors import KernelArgumentError
from llmbench.kernels.rms_norm import rms_norm, rms_norm_cost, rms_norm_reference

EPS = 1e-5
TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}


def inputs(num_tokens, hidden, dtype, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    wide = (torch.randn(num_tokens, hidden + 5, generator=g) * 3).to(dtype).to(device)
    weight = 1 + 0.5 * torch.randn(hidden, generator=g)
    residual = torch.randn(num_tokens, hidden, generator=g)
    x = wide[:, :hidden]  # a row-strided view, as the engine's slices are
    return x, weight.to(dtype).to(device), residual.to(dtype).to(device)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize(("num_tokens", "hidden"), [(1, 64), (7, 200)])
def test_kernel_matches_reference(dtype, num_tokens, hidden, device):
    x, weight, _ = inputs(num_tokens, hidden, dtype, device)
    assert x.stride(0) == hidden + 5
    out = rms_norm(x, weight, EPS)
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(out, rms_norm_reference(x, weight, EPS), atol=tol, rtol=tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_fused_residual_add_updates_the_residual_and_normalises_the_sum(dtype, device):
    x, weight, residual = inputs(5, 96, dtype, device, seed=1)
    summed = (x.float() + residual.float()).to(dtype)  # the unfused add, rounded to the dtype
    expected_residual = residual.clone()
    expected = rms_norm_reference(x, weight, EPS, residual=expected_residual)
    assert torch.equal(expected_residual, summed)
    torch.testing.assert_close(expected, rms_norm_reference(summed, weight, EPS))
    out = rms_norm(x, weight, EPS, residual=residual)
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(residual, summed, atol=tol, rtol=tol)
    torch.testing.assert_close(out, expected, atol=tol, rtol=tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_reference_matches_the_engines_rms_norm(dtype):
    x, weight, _ = inputs(6, 64, dtype, torch.device("cpu"))
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(
        rms_norm_reference(x, weight, EPS), engine_rms_norm(x, weight, EPS), atol=tol, rtol=tol
    )


def test_cost_by_hand():
    # T = 3, h = 8, float16: read x 3·8·2 = 48 B, weight 8·2 = 16 B, write out 48 B → 112 B;
    # FLOPs 4 per element: 4·24 = 96.
    assert rms_norm_cost(3, 8, "float16") == KernelCost(bytes=112, flops=96)
    # + residual: read 48 B and write back 48 B → 208 B; + one add per element → 120 FLOPs.
    assert rms_norm_cost(3, 8, "float16", has_residual=True) == KernelCost(208, 120)
    # float32 activations with a float16 weight: 2·24·4 + 8·2 = 208 B.
    assert rms_norm_cost(3, 8, torch.float32, weight_dtype="float16").bytes == 208


def test_layout_errors_are_one_line(device):
    x, weight, residual = inputs(4, 32, torch.float32, device)
    with pytest.raises(KernelArgumentError, match=r"rms_norm: x must be contiguous in its last"):
        rms_norm(torch.randn(32, 4, device=device).t(), weight, EPS)
    with pytest.raises(KernelArgumentError, match=r"rms_norm: weight must have shape \[h\]"):
        rms_norm(x, weight[:16], EPS)
    with pytest.raises(KernelArgumentError, match="rms_norm: x has dtype int64; pass float32"):
        rms_norm(torch.ones(4, 32, dtype=torch.long, device=device), weight, EPS)
    with pytest.raises(
        KernelArgumentError, match="rms_norm: residual has dtype float16, x float32"
    ):
        rms_norm(x, weight, EPS, residual=residual.half())
    with pytest.raises(KernelArgumentError, match=r"rms_norm: x must be 2-D \[T, h\]"):
        rms_norm(x[None], weight, EPS)


@pytest.mark.gpu
def test_bfloat16_and_a_large_hidden_on_the_gpu():
    x, weight, residual = inputs(33, 8192, torch.bfloat16, torch.device("cuda"))
    expected_residual = residual.clone()
    expected = rms_norm_reference(x, weight, EPS, residual=expected_residual)
    out = rms_norm(x, weight, EPS, residual=residual)
    torch.testing.assert_close(residual, expected_residual, atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(out, expected, atol=2e-2, rtol=2e-2)
