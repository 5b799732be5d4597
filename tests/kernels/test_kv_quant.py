"""llmbench.kernels.kv_quant: the int8/int4 quantise and dequantise kernels against their
references (bit-exact, ties included), the references against the engine's `kv_quant`
(bit-exact), the costs by hand, and the layout errors."""

from __future__ import annotations

import pytest
import torch

from llmbench.engine import kv_quant as engine_kv_quant
from llmbench.kernels.cost import KernelCost
from llmbench.kernels.errors import KernelArgumentError
from llmbench.kernels.kv_quant import (
    QMAX,
    dequantize,
    dequantize_cost,
    dequantize_reference,
    quantize,
    quantize_cost,
    quantize_reference,
)


def kv_rows(num_tokens, num_kv_heads, head_dim, dtype, device, seed=0):
    """K-like rows [T, nkv, d] with an outlier channel, as a token-strided view, plus one row
    of exact half-steps (absmax = qmax → scale 1, values k + 0.5: round-half-even ties)."""
    g = torch.Generator().manual_seed(seed)
    wide = torch.randn(num_tokens, num_kv_heads + 1, head_dim, generator=g)
    wide[..., 1] *= 20
    return wide.to(dtype).to(device)[:, 1:]


def with_ties(x: torch.Tensor, fmt: str) -> torch.Tensor:
    qmax = QMAX[fmt]
    ties = torch.arange(x.shape[-1], dtype=torch.float32) % (2 * qmax) - qmax + 0.5  # ±k.5
    ties[0] = qmax  # the absmax: scale = qmax / qmax = 1 exactly
    x = x.clone()
    x[0, 0] = ties.to(x.dtype)
    return x


@pytest.mark.parametrize("fmt", ["int8", "int4"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_kernels_match_references_bit_exact(fmt, dtype, device):
    x = with_ties(kv_rows(5, 2, 32, dtype, device), fmt)
    codes, scales = quantize(x, fmt)
    ref_codes, ref_scales = quantize_reference(x, fmt)
    assert scales[0, 0] == 1.0
    assert torch.equal(codes, ref_codes) and torch.equal(scales, ref_scales)
    values = dequantize(codes, scales, fmt, dtype)
    assert torch.equal(values, dequantize_reference(codes, scales, fmt, dtype))
    assert values.shape == x.shape


@pytest.mark.parametrize("fmt", ["int8", "int4"])
def test_round_half_to_even_on_exact_ties(fmt, device):
    x = with_ties(kv_rows(1, 1, 16, torch.float32, device), fmt)
    codes, _ = quantize(x, fmt)
    values = dequantize(codes, torch.ones(1, 1, dtype=torch.float16, device=device), fmt, x.dtype)
    # 0.5 → 0, 1.5 → 2, 2.5 → 2, -0.5 → 0, -1.5 → -2 (torch.round's rule)
    assert torch.equal(values[0, 0].cpu(), torch.round(x[0, 0].cpu()))


@pytest.mark.parametrize("fmt", ["int8", "int4"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_references_match_the_engines_kv_quant_bit_exact(fmt, dtype):
    x = with_ties(kv_rows(9, 3, 64, torch.float32, torch.device("cpu"), seed=4), fmt).to(dtype)
    codes, scales = quantize_reference(x, fmt)
    engine_codes, engine_scales = engine_kv_quant.quantize(x, fmt)
    assert torch.equal(codes, engine_codes) and torch.equal(scales, engine_scales)
    assert torch.equal(
        dequantize_reference(codes, scales, fmt, dtype),
        engine_kv_quant.dequantize(codes, scales, fmt, dtype),
    )


@pytest.mark.parametrize("fmt", ["int8", "int4"])
def test_round_trip_is_within_half_a_step(fmt, device):
    x = kv_rows(6, 2, 32, torch.float32, device, seed=5)
    back = dequantize(*quantize(x, fmt), fmt, torch.float32)
    half_step = x.abs().amax(-1, keepdim=True) / QMAX[fmt] / 2
    assert ((back - x).abs() <= half_step * (1 + 2**-10)).all()


def test_costs_by_hand():
    # R = 4 rows of d = 8 float16: read 4·8·2 = 64 B; int8 codes 32 B; float16 scales 8 B →
    # 104 B; FLOPs 3 per element (|x|, max, divide) · 32 = 96.
    assert quantize_cost(4, 8, "int8", "float16") == KernelCost(bytes=104, flops=96)
    # int4: codes 32 · 0.5 = 16 B → 88 B.
    assert quantize_cost(4, 8, "int4", torch.float16) == KernelCost(bytes=88, flops=96)
    # dequantise int4 to float32: codes 16 + scales 8 + write 4·8·4 = 128 → 152 B; FLOPs 2
    # per element (- 8, × scale) → 64; int8: codes 32 → 168 B, 1 per element → 32.
    assert dequantize_cost(4, 8, "int4", "float32") == KernelCost(bytes=152, flops=64)
    assert dequantize_cost(4, 8, "int8", "float32") == KernelCost(bytes=168, flops=32)


def test_layout_errors_are_one_line(device):
    x = kv_rows(2, 2, 16, torch.float32, device)
    with pytest.raises(KernelArgumentError, match="kv_quantize: fmt 'int2': use 'int8' or 'int4'"):
        quantize(x, "int2")
    with pytest.raises(KernelArgumentError, match="kv_quantize: int4 packs pairs: head_dim must"):
        quantize(torch.randn(2, 2, 15, device=device), "int4")
    with pytest.raises(
        KernelArgumentError, match="kv_quantize: x must be contiguous in its last 2"
    ):
        quantize(x.transpose(1, 2), "int8")
    codes, scales = quantize(x, "int8")
    with pytest.raises(
        KernelArgumentError, match="kv_dequantize: codes has dtype int8; pass uint8"
    ):
        dequantize(codes, scales, "int4", torch.float32)
    with pytest.raises(
        KernelArgumentError, match=r"kv_dequantize: scales must have shape \[T, nkv"
    ):
        dequantize(codes, scales[:1], "int8", torch.float32)
    with pytest.raises(KernelArgumentError, match="kv_dequantize: scales has dtype float32; pass"):
        dequantize(codes, scales.float(), "int8", torch.float32)


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", ["int8", "int4"])
def test_bfloat16_and_head_dim_128_on_the_gpu(fmt):
    x = with_ties(kv_rows(257, 8, 128, torch.bfloat16, torch.device("cuda")), fmt)
    codes, scales = quantize(x, fmt)
    ref_codes, ref_scales = quantize_reference(x, fmt)
    assert torch.equal(codes, ref_codes) and torch.equal(scales, ref_scales)
    values = dequantize(codes, scales, fmt, torch.bfloat16)
    assert torch.equal(values, dequantize_reference(codes, scales, fmt, torch.bfloat16))
