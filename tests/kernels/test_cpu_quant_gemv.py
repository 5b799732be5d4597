"""The extension's int8/int4 matmul (`kernels.cpu_quant_gemv`): its layouts against the
pure quantisation functions, the kernel against its exact reference (the same integer sums in
float64) and against the float product of its dequantised weights, its checks and its cost.
The kernel's tests (marked `quant_kernel`) need a build for AVX2 or better, which has it (AVX-512
VNNI's VPDPBUSD or AVX2's byte products: the same sums): a scalar build has none, and there
they are deselected, as `gpu` tests are without a GPU. `test_has_quant_gemv_follows_the_isa`
runs everywhere."""

from __future__ import annotations

import pytest
import torch

from llmbench.engine.quant.codes import (
    dequantize_int4,
    dequantize_int8,
    quantize_int4,
    quantize_int8,
)
from llmbench.kernels import cpu_extension, cpu_quant_gemv
from llmbench.kernels.errors import KernelArgumentError

# padded rows (7, 13, 40), partial groups (40, 100), several blocks of 16 rows with a partial one
SHAPES = [(960, 576), (7, 40), (13, 100), (4, 32), (40, 64)]


@pytest.fixture(scope="module")
def backend() -> cpu_extension.CpuExtension:
    result = cpu_extension.default()
    assert result.has_quant_gemv, f"no int8/int4 kernel in this build: {result.describe()}"
    return result


def _random(shape, seed, scale=1.0):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)) * scale


def _int4(weight: torch.Tensor, has_zero: bool = True):
    q = quantize_int4(weight, 32, has_zero, torch.float16)
    return q, *cpu_quant_gemv.pack_int4(q.codes, q.scale, q.zero)


def _int8(weight: torch.Tensor):
    codes, scale = quantize_int8(weight, torch.float32)
    return codes, scale, *cpu_quant_gemv.pack_int8(codes, scale)


def _layout(weight: torch.Tensor, bits: int):
    """(codes, scale_zero, scale) of `weight` in the extension's int4 or int8 layout."""
    if bits == 4:
        _, codes, scale_zero = _int4(weight)
        return codes, scale_zero, None
    _, _, codes, scale = _int8(weight)
    return codes, None, scale


def test_has_quant_gemv_follows_the_isa():
    assert cpu_extension.CpuExtension("extension", "x", "avx512bf16_vnni", "ns").has_quant_gemv
    assert cpu_extension.CpuExtension("extension", "x", "avx512bf16", "ns").has_quant_gemv
    assert cpu_extension.CpuExtension("extension", "x", "avx2", "ns").has_quant_gemv
    assert not cpu_extension.CpuExtension("extension", "x", "scalar", "ns").has_quant_gemv
    assert not cpu_extension.CpuExtension("torch", "LLMBENCH_CPU_EXTENSION=torch").has_quant_gemv


@pytest.mark.parametrize("shape", SHAPES)
def test_layouts_hold_the_pure_functions_weights(shape):
    weight = _random(shape, 1, 0.05)
    q, packed, scale_zero = _int4(weight)
    blocks, groups = -(-shape[0] // 16), -(-shape[1] // 32)
    assert packed.shape == (blocks, groups * 4, 16, 4)
    assert scale_zero.shape == (blocks, groups, 2, 16) and scale_zero.dtype == torch.float16
    unpacked = cpu_quant_gemv.dequantize_int4_blocks(packed, scale_zero, *shape)
    torch.testing.assert_close(unpacked, dequantize_int4(q), rtol=0, atol=0)
    codes, scale, packed8, scale8 = _int8(weight)
    assert packed8.shape == (blocks, groups * 8, 16, 4)
    unpacked8 = cpu_quant_gemv.dequantize_int8_blocks(packed8, scale8, *shape)
    torch.testing.assert_close(unpacked8, dequantize_int8(codes, scale), rtol=0, atol=0)


@pytest.mark.quant_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", SHAPES)
def test_the_extensions_dequantise_is_the_layouts_weights_rounded_once(backend, shape, dtype):
    weight = _random(shape, 1, 0.05)
    _, packed, scale_zero = _int4(weight)
    w4 = cpu_quant_gemv.dequantize(backend, packed, scale_zero, None, *shape, dtype)
    expected4 = cpu_quant_gemv.dequantize_int4_blocks(packed, scale_zero, *shape)
    assert w4.dtype == dtype and torch.equal(w4, expected4.to(dtype))
    _, _, packed8, scale8 = _int8(weight)
    w8 = cpu_quant_gemv.dequantize(backend, packed8, None, scale8, *shape, dtype)
    assert torch.equal(w8, cpu_quant_gemv.dequantize_int8_blocks(packed8, scale8, *shape).to(dtype))


def test_activation_quantisation_by_hand():
    x = torch.zeros(1, 64)
    x[0, 0], x[0, 1], x[0, 2] = 2.54, -1.27, 0.01  # group 0: max 2.54 → scale 0.02
    xq, sx, xsum = cpu_quant_gemv.quantize_activations(x)  # group 1: all zeros
    assert xq.shape == (1, 2, 32)
    assert xq[0, 0, :3].tolist() == [127.0, -64.0, 0.0]  # -63.5 rounds half to even: -64
    assert sx[0].tolist() == pytest.approx([0.02, 0.0], rel=1e-6)
    assert xsum[0].tolist() == pytest.approx([1.28, 0.0], rel=1e-6)
    assert not xq[0, 1].any()


@pytest.mark.quant_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("num_rows", [1, 3, 4, 6, 16])  # the kernel takes x 4 rows at a time
@pytest.mark.parametrize("bits", [4, 8])
def test_kernel_matches_its_exact_reference(backend, dtype, shape, num_rows, bits):
    weight = _random(shape, 2, 0.05)
    x = _random((num_rows, shape[1]), 3).to(dtype)
    codes, scale_zero, scale = _layout(weight, bits)
    y = cpu_quant_gemv.quant_gemv(backend, x, codes, scale_zero, scale, shape[0])
    expected = cpu_quant_gemv.quant_gemv_reference(x, codes, scale_zero, scale, shape[0])
    assert y.dtype == dtype and y.shape == (num_rows, shape[0])
    # The same integer sums; float32 scaling and summation in another order, one rounding
    # (near-zero outputs: an absolute error on the outputs' scale).
    ulp = {torch.float32: 1e-5, torch.bfloat16: 2**-8, torch.float16: 2**-10}[dtype]
    atol = ulp * expected.float().abs().max().item()
    torch.testing.assert_close(y.float(), expected.float(), rtol=ulp, atol=atol)


@pytest.mark.quant_kernel
@pytest.mark.parametrize("bits", [4, 8])
def test_kernel_is_close_to_the_float_product_of_its_weights(backend, bits):
    """Quantising x per 32 to int8 costs under 1% of the product (rms, Gaussian x)."""
    weight, x = _random((960, 576), 4, 0.05), _random((2, 576), 5)
    if bits == 4:
        _, codes, scale_zero = _int4(weight)
        scale, dense = None, cpu_quant_gemv.dequantize_int4_blocks(codes, scale_zero, 960, 576)
    else:
        _, _, codes, scale = _int8(weight)
        scale_zero, dense = None, cpu_quant_gemv.dequantize_int8_blocks(codes, scale, 960, 576)
    y = cpu_quant_gemv.quant_gemv(backend, x, codes, scale_zero, scale, 960)
    exact = x @ dense.t()
    assert ((y - exact).norm() / exact.norm()).item() < 0.01


@pytest.mark.quant_kernel
def test_symmetric_int4_and_bias_and_residual(backend):
    weight, x = _random((13, 100), 6, 0.05), _random((3, 100), 7).bfloat16()
    _, codes, scale_zero = _int4(weight, has_zero=False)
    bias, residual = _random((13,), 8).bfloat16(), _random((3, 13), 9).bfloat16()
    y = cpu_quant_gemv.quant_gemv(backend, x, codes, scale_zero, None, 13, bias, residual)
    expected = cpu_quant_gemv.quant_gemv_reference(x, codes, scale_zero, None, 13, bias, residual)
    torch.testing.assert_close(y.float(), expected.float(), rtol=2**-8, atol=0.02)


# rows: one partial tile of 16, an odd number of tiles (the last pair has one), whole tiles,
# and more than 128 (every panel dequantised first, x taken 128 rows at a time)
@pytest.mark.quant_kernel
@pytest.mark.parametrize("num_rows", [17, 40, 64, 150])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("bits", [4, 8])
def test_weight_only_gemm_matches_its_reference(backend, bits, shape, num_rows):
    """bfloat16 x on AMX tiles, AVX-512 BF16 vectors or (AVX2) float32 panels: W dequantised
    a block at a time; float32 x: W dequantised whole, then one addmm. Both are x times the
    same dequantised W, summed in float32 and rounded once with the bias and residual, where
    the reference rounds the float64 sum once: at most one unit in the last place apart.
    (addmm adds one tensor: the residual plus the bias, rounded first.)"""
    weight = _random(shape, 13, 0.05)
    codes, scale_zero, scale = _layout(weight, bits)
    for dtype, ulp in ((torch.bfloat16, 2**-7), (torch.float32, 1e-5)):
        x = _random((num_rows, shape[1]), 14).to(dtype)
        bias, residual = _random((shape[0],), 15).to(dtype), _random((num_rows, shape[0]), 16)
        residual = residual.to(dtype)
        args = (x, codes, scale_zero, scale, shape[0], bias, residual)
        y = cpu_quant_gemv.quant_gemv(backend, *args, op=cpu_quant_gemv.GEMM_OP)
        expected = cpu_quant_gemv.quant_gemm_reference(*args)
        if dtype == torch.float32:
            added = (x, codes, scale_zero, scale, shape[0], None, residual + bias)
            expected = cpu_quant_gemv.quant_gemm_reference(*added)
        assert y.dtype == dtype and y.shape == (num_rows, shape[0])
        assert torch.isfinite(y).all()
        torch.testing.assert_close(y.float(), expected.float(), rtol=ulp, atol=1e-4)


@pytest.mark.quant_kernel
def test_weight_only_gemm_keeps_x_as_it_is(backend):
    """Unlike the decode matmul, the prefill product quantises nothing of x: it is x times the
    dequantised weights to bfloat16's rounding (0.23% rms here; the decode matmul, x
    quantised per 32, 0.57%)."""
    weight, x = _random((960, 576), 4, 0.05), _random((40, 576), 5).bfloat16()
    _, _, codes, scale = _int8(weight)
    dense = cpu_quant_gemv.dequantize_int8_blocks(codes, scale, 960, 576)
    exact = x.double() @ dense.double().t()
    y = cpu_quant_gemv.quant_gemv(backend, x, codes, None, scale, 960, op=cpu_quant_gemv.GEMM_OP)
    assert ((y.double() - exact).norm() / exact.norm()).item() < 0.003


@pytest.mark.quant_kernel
def test_argument_errors_name_the_argument(backend):
    weight, x = _random((8, 64), 10, 0.05), _random((1, 64), 11)
    _, codes, scale_zero = _int4(weight)
    _, _, codes8, scale8 = _int8(weight)
    with pytest.raises(KernelArgumentError, match="give scale_zero"):
        cpu_quant_gemv.quant_gemv(backend, x, codes, scale_zero, scale8, 8)
    with pytest.raises(KernelArgumentError, match="codes has dtype int8"):
        cpu_quant_gemv.quant_gemv(backend, x, codes8, scale_zero, None, 8)
    with pytest.raises(KernelArgumentError, match="do not cover"):
        cpu_quant_gemv.quant_gemv(backend, x, codes, scale_zero, None, 17)  # 16 rows padded
    with pytest.raises(KernelArgumentError, match="do not cover"):
        cpu_quant_gemv.quant_gemv(backend, _random((1, 65), 12), codes8, None, scale8, 8)
    with pytest.raises(KernelArgumentError, match="scale has dtype float16"):
        cpu_quant_gemv.quant_gemv(backend, x, codes8, None, scale8.half(), 8)
    with pytest.raises(KernelArgumentError, match=r"codes must have shape \[N/16, K/8, 16, 4\]"):
        cpu_quant_gemv.quant_gemv(backend, x, codes.view(1, 16, 8, 4), scale_zero, None, 8)


def test_cost_counts_codes_scales_and_activations():
    # int4: 960·576/2 code bytes + 960·18 groups·4 scale bytes + bf16 x (576) and y (960)
    cost = cpu_quant_gemv.quant_gemv_cost(1, 960, 576, 4, torch.bfloat16)
    assert cost.bytes == 960 * 288 + 960 * 18 * 4 + 2 * (576 + 960)
    assert cost.flops == 2 * 960 * 576
    cost8 = cpu_quant_gemv.quant_gemv_cost(2, 960, 576, 8, torch.float32)
    assert cost8.bytes == 960 * 576 + 960 * 4 + 4 * (2 * 576 + 2 * 960)
