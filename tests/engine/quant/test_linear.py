"""Quantised linear layers against references: their own dequantised weights (the kernels are
exact up to bfloat16 rounding) and the float weights (the scheme's quantisation error)."""

from __future__ import annotations

import pytest
import torch

from llmbench.engine.linear import Linear, make_linear
from llmbench.engine.quant import linear as quant_linear
from llmbench.engine.quant.codes import dequantize_int4, quantize_int4, quantize_int8
from llmbench.engine.quant.linear import (
    INT8_KERNEL_MAX_ROWS,
    ExtensionQuantLinear,
    Int4Linear,
    Int8Linear,
    PackedInt4Linear,
    int4_layer,
    quantize_linear,
)
from llmbench.engine.quant.scheme import parse_quantize
from llmbench.kernels import cpu_extension

SCHEMES = ["int8", "int4:32", "int4:64", "int4:128", "int4:32:sym", "int4:128:sym"]
# Rows around the int8 kernel / dequantise switch, and a prefill-sized batch.
ROWS = [1, 2, 3, INT8_KERNEL_MAX_ROWS, INT8_KERNEL_MAX_ROWS + 1, 40]
# [out, in]: SmolLM2's qkv; and odd sizes (200 columns: the int8 kernel's multiple-of-16 case,
# partial int4 groups; 100 rows: int4's multiple-of-16 row padding).
SHAPES = [(960, 576), (100, 200)]
# Relative Frobenius error of x @ W^T against float weights, Gaussian W, per scheme. A weight's
# error is uniform within ± scale / 2, so its rms is scale / √12 with scale ≈ max|w| / 127
# (int8, over a row: max ≈ 3.3σ) or ≈ (max − min) / 15 over a group (≈ 4σ at 32, 4.6σ at 128):
# int8 ≈ 0.008, int4 ≈ 0.08-0.11 (the symmetric grid wastes up to a level). Thresholds: ~1.4×.
FLOAT_TOLERANCE = {
    "int8": 0.012,
    "int4:32": 0.11,
    "int4:64": 0.13,
    "int4:128": 0.15,
    "int4:32:sym": 0.13,
    "int4:128:sym": 0.16,
}


def _relative_error(y: torch.Tensor, ref: torch.Tensor) -> float:
    return ((y.double() - ref.double()).norm() / ref.double().norm()).item()


def _dequantized(weight: torch.Tensor, name: str) -> torch.Tensor:
    """The weights the CPU layer holds, dequantised by the pure functions (bfloat16 scales)."""
    scheme = parse_quantize(name)
    if scheme.bits == 8:
        codes, scale = quantize_int8(weight, torch.bfloat16)
        return codes.float() * scale[:, None]
    return dequantize_int4(
        quantize_int4(weight, scheme.group_size, scheme.has_zero, torch.bfloat16)
    )


def _problem(shape: tuple[int, int], num_rows: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    weight = torch.randn(*shape, generator=g) * 0.05
    x = torch.randn(num_rows, shape[1], generator=g)
    return weight, x


@pytest.mark.parametrize("name", SCHEMES)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("num_rows", ROWS)
def test_layer_computes_x_times_its_dequantised_weights(name, shape, num_rows):
    weight, x = _problem(shape, num_rows)
    layer = quantize_linear(weight, None, parse_quantize(name))
    y = layer(x)
    assert y.shape == (num_rows, shape[0]) and y.dtype == torch.float32
    # The kernels take bfloat16 activations: the reference rounds x the same way.
    ref = x.bfloat16().double() @ _dequantized(weight, name).double().t()
    assert _relative_error(y, ref) < 4e-3


@pytest.mark.parametrize("name", SCHEMES)
@pytest.mark.parametrize("num_rows", [1, 40])
def test_layer_is_within_the_schemes_error_of_float(name, num_rows):
    weight, x = _problem((960, 576), num_rows, seed=1)
    y = quantize_linear(weight, None, parse_quantize(name))(x)
    assert _relative_error(y, x @ weight.t()) < FLOAT_TOLERANCE[name]


@pytest.mark.parametrize("name", ["int8", "int4:32"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_bias_and_residual_are_added_in_the_models_dtype(name, dtype):
    weight, x = _problem((100, 200), 3, seed=2)
    bias = torch.randn(100).to(dtype)
    residual = torch.randn(3, 100).to(dtype)
    scheme = parse_quantize(name)
    plain = quantize_linear(weight.to(dtype), None, scheme)(x.to(dtype))
    y = quantize_linear(weight.to(dtype), bias, scheme)(x.to(dtype), residual=residual)
    assert y.dtype == dtype
    torch.testing.assert_close(y, plain + bias + residual, rtol=0, atol=0.05)


def test_cpu_layers_hold_the_bytes_they_should():
    weight = torch.randn(96, 576)
    int8 = quantize_linear(weight, torch.zeros(96), parse_quantize("int8"))
    # int8 codes 96·576 + bfloat16 scales 96·2 + float32 bias 96·4
    assert isinstance(int8, Int8Linear) and int8.num_bytes == 96 * 576 + 96 * 2 + 96 * 4
    int4 = quantize_linear(weight, None, parse_quantize("int4:32"))
    # two codes a byte 96·288, (scale, zero) in bfloat16 per group of 32: 18 groups · 96 · 4
    assert isinstance(int4, PackedInt4Linear) and int4.num_bytes == 96 * 288 + 18 * 96 * 4
    # 100 rows pad to 112 and 200 columns to 224 (7 groups): the padding is held, and counted.
    padded = quantize_linear(torch.randn(100, 200), None, parse_quantize("int4:32"))
    assert padded.num_bytes == 112 * 112 + 7 * 112 * 4


@pytest.mark.parametrize("name", ["int4:32", "int4:128", "int4:64:sym"])
def test_dequantise_per_call_layer_matches_the_pure_functions(name):
    """The layout used off the CPU (CUDA), run here: exact against `dequantize_int4`."""
    scheme = parse_quantize(name)
    weight, x = _problem((100, 200), 5, seed=3)
    layer = int4_layer(weight, None, scheme)
    assert isinstance(layer, Int4Linear) and (layer.zero is None) == (not scheme.has_zero)
    q = quantize_int4(weight, scheme.group_size, scheme.has_zero)
    torch.testing.assert_close(layer.dequantize(), dequantize_int4(q), rtol=0, atol=0)
    torch.testing.assert_close(layer(x), x @ dequantize_int4(q).t())
    groups = -(-200 // scheme.group_size)
    scale_bytes = 100 * groups * 4 * (2 if scheme.has_zero else 1)
    assert layer.num_bytes == 100 * groups * scheme.group_size // 2 + scale_bytes


def test_make_linear_quantises_only_when_asked(monkeypatch):
    weight = torch.randn(64, 32)
    assert isinstance(make_linear(weight), Linear)
    # The extension's VNNI layouts where it has them (int8, int4 in groups of 32), else torch's.
    vnni = cpu_extension.default().has_quant_gemv
    for name, torch_layer in (("int8", Int8Linear), ("int4:32", PackedInt4Linear)):
        expected = ExtensionQuantLinear if vnni else torch_layer
        assert isinstance(make_linear(weight, None, parse_quantize(name)), expected)
    assert isinstance(make_linear(weight, None, parse_quantize("int4:64")), PackedInt4Linear)
    monkeypatch.setattr(
        cpu_extension, "default", lambda: cpu_extension.CpuExtension("torch", "test")
    )
    assert isinstance(make_linear(weight, None, parse_quantize("int8")), Int8Linear)


@pytest.mark.parametrize("is_native", [True, False])
def test_int8_prefill_dequantises_into_float32_on_a_cpu_without_bf16_products(
    monkeypatch, is_native
):
    flags = {"avx512f", "avx512_bf16"} if is_native else {"avx2", "fma", "f16c"}
    monkeypatch.setattr(quant_linear, "this_cpu_flags", lambda: frozenset(flags))
    g = torch.Generator().manual_seed(5)
    weight = torch.randn(48, 32, generator=g)
    layer = quant_linear.int8_layer(weight, None, torch.bfloat16)
    assert layer.is_float32_products is not is_native
    x = torch.randn(quant_linear.INT8_KERNEL_MAX_ROWS + 1, 32, generator=g).bfloat16()
    codes, scale = layer.codes[:, :32], layer.scale
    dtype = torch.bfloat16 if is_native else torch.float32
    # the codes in the product's dtype, the scale after the matmul, one rounding at the end
    expected = (x.to(dtype) @ codes.to(dtype).t()).mul_(scale).bfloat16()
    assert torch.equal(layer(x), expected)
