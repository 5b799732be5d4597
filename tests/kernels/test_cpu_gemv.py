"""The CPU decode matmul (`kernels.cpu_gemv`): against the float32 reference and torch's addmm,
its checks, its cost and its row limits. The extension it runs in is built or loaded once per
machine (`cpu_extension`, tested in test_cpu_extension.py) through the `backend` fixture."""

from __future__ import annotations

import os

import pytest
import torch

from llmbench.kernels import cpu_extension, cpu_gemv
from llmbench.kernels.cost import KernelCost
from llmbench.kernels.cpu_info import this_cpu_flags
from llmbench.kernels.errors import KernelArgumentError


def _random(shape, dtype, seed):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
# From 2 rows with K a multiple of 32 and N >= 32, a CPU with AMX multiplies on the tiles
# (whole 16-row blocks; 40 rows: 2 blocks and 8 left to the vector loops), 20 and 64 rows in
# chunks of 16 rows of x. Without AMX, from 16 rows with K a multiple of 32, bfloat16 goes to
# the panels: 14 rows of x a pass, then 8, 4, 2, 1 (17, 20, 64, 150), 960 rows of W in whole
# blocks, 40 and 5 ending in a partial one, and above 128 rows every panel filled first (150).
# On AVX2 (no bfloat16 products) bfloat16 from 16 rows with K a multiple of 8 goes to float32
# panels the same way, 6 rows of x a pass, then 4, 2, 1.
@pytest.mark.parametrize("num_rows", [1, 2, 3, 4, 8, 17, 20, 64, 150])
@pytest.mark.parametrize(
    "out_features, in_features", [(960, 576), (7, 33), (13, 100), (5, 1536), (40, 64)]
)
@pytest.mark.parametrize("adds", ["none", "bias", "residual", "both"])
def test_matches_float32_reference(backend, dtype, num_rows, out_features, in_features, adds):
    x = _random((num_rows, in_features), dtype, 1)
    weight = _random((out_features, in_features), dtype, 2)
    bias = _random((out_features,), dtype, 3) if adds in ("bias", "both") else None
    residual = _random((num_rows, out_features), dtype, 4) if adds in ("residual", "both") else None
    y = cpu_gemv.gemv(backend, x, weight, bias, residual)
    expected = cpu_gemv.gemv_reference(x, weight, bias, residual)
    assert y.dtype == dtype and y.shape == (num_rows, out_features)
    # Both sum in float32 and round once: they differ by the summation order only, at most
    # about one unit in the last place of the 16-bit result (float32: a few units of the sum's).
    ulp = {torch.bfloat16: 2**-7, torch.float16: 2**-10, torch.float32: 2**-16}[dtype]
    torch.testing.assert_close(y.float(), expected.float(), rtol=ulp, atol=ulp * in_features**0.5)


def test_the_build_takes_the_amx_tiles_where_the_cpu_has_them_unless_told(backend):
    wanted = cpu_extension.wanted_isa(os.environ)  # test_cpu_lesser_isa.py sets one
    if wanted is None:
        assert backend.isa.endswith("_amx") == ({"amx_bf16", "amx_tile"} <= this_cpu_flags())
    assert backend.isa == (wanted or cpu_extension.runnable_isas(this_cpu_flags())[0])


def test_matches_torch_bfloat16_addmm(backend):
    x = _random((1, 1536), torch.bfloat16, 5)
    weight = _random((576, 1536), torch.bfloat16, 6)  # down_proj of SmolLM2-135M
    residual = _random((1, 576), torch.bfloat16, 7)
    y = cpu_gemv.gemv(backend, x, weight, None, residual)
    torch.testing.assert_close(y, torch.addmm(residual, x, weight.t()), rtol=1.6e-2, atol=0.25)


def test_strided_rows_of_x_are_read_in_place(backend):
    wide = _random((3, 200), torch.bfloat16, 8)
    x = wide[:, :100]  # row stride 200
    weight = _random((9, 100), torch.bfloat16, 9)
    torch.testing.assert_close(
        cpu_gemv.gemv(backend, x, weight), cpu_gemv.gemv_reference(x.contiguous(), weight)
    )


def test_launcher_rejects_wrong_layouts(backend):
    x = torch.randn(1, 64).bfloat16()
    weight = torch.randn(32, 64).bfloat16()
    with pytest.raises(KernelArgumentError, match="weight has dtype float64"):
        cpu_gemv.gemv(backend, x.double(), weight.double())
    with pytest.raises(KernelArgumentError, match="x has dtype float16, weight bfloat16"):
        cpu_gemv.gemv(backend, x.half(), weight)
    with pytest.raises(KernelArgumentError, match="weight must be contiguous"):
        cpu_gemv.gemv(backend, x, torch.randn(64, 32).bfloat16().t())
    with pytest.raises(KernelArgumentError, match=r"x must have shape \[M, K\] = \(1, 64\)"):
        cpu_gemv.gemv(backend, torch.randn(1, 65).bfloat16(), weight)
    with pytest.raises(KernelArgumentError, match=r"bias must have shape \[N\] = \(32,\)"):
        cpu_gemv.gemv(backend, x, weight, bias=torch.randn(31).bfloat16())
    with pytest.raises(KernelArgumentError, match=r"residual must have shape \[M, N\]"):
        cpu_gemv.gemv(backend, x, weight, residual=torch.randn(2, 32).bfloat16())


def test_cost_is_a_hand_count():
    # qkv of SmolLM2-135M with a bias, one row, the residual added: bfloat16, 2 bytes each.
    cost = cpu_gemv.gemv_cost(1, 960, 576, "bfloat16", has_bias=True, has_residual=True)
    weights, x, y, bias, residual = 960 * 576, 576, 960, 960, 960
    assert cost == KernelCost(2 * (weights + x + y + bias + residual), 2 * 960 * 576 + 960 + 960)
    assert cpu_gemv.gemv_cost(4, 576, 1536, torch.float16) == KernelCost(
        2 * (576 * 1536 + 4 * 1536 + 4 * 576), 2 * 4 * 576 * 1536
    )


def test_max_rows_per_dtype():
    no_amx, amx = "avx512bf16_vnni", "avx512bf16_vnni_amx"
    assert cpu_gemv.max_rows(torch.bfloat16, no_amx) == cpu_gemv.MAX_ROWS_BF16_PANELS == 64
    assert cpu_gemv.max_rows(torch.bfloat16, amx) == cpu_gemv.MAX_ROWS_BF16_PANELS
    assert cpu_gemv.max_rows(torch.bfloat16, "avx512_vnni") == cpu_gemv.MAX_ROWS_BF16 == 16
    assert cpu_gemv.max_rows(torch.float32, amx) == cpu_gemv.MAX_ROWS_F32
    assert cpu_gemv.max_rows(torch.float16, no_amx) == cpu_gemv.MAX_ROWS_F16
    assert cpu_gemv.max_rows(torch.float32, no_amx) == cpu_gemv.MAX_ROWS_F32
    # no bfloat16 products in the CPU (AVX2 only): torch's bfloat16 matmul loses to 64 rows
    assert cpu_gemv.max_rows(torch.bfloat16, "avx2", False) == cpu_gemv.MAX_ROWS_BF16_NO_NATIVE
    assert cpu_gemv.MAX_ROWS_BF16_NO_NATIVE == 64
    assert cpu_gemv.max_rows(torch.bfloat16, "avx2", True) == cpu_gemv.MAX_ROWS_BF16
    assert cpu_gemv.max_rows(torch.bfloat16, no_amx, False) == cpu_gemv.MAX_ROWS_BF16_PANELS
    assert cpu_gemv.max_rows(torch.float32, "avx2", False) == cpu_gemv.MAX_ROWS_F32
