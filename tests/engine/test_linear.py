"""The float layer (`engine.linear.Linear`): which path a call takes, and what it computes."""

from __future__ import annotations

import pytest
import torch

from llmbench.engine import linear
from llmbench.engine.linear import Linear
from llmbench.kernels import cpu_gemv
from llmbench.kernels.cpu_extension import CpuExtension


def _emulated_bf16(monkeypatch, is_native: bool) -> None:
    """Build layers as on a CPU with (or without) bfloat16 products, whatever this one has."""
    flags = {"avx512f", "avx512_bf16"} if is_native else {"avx2", "fma", "f16c"}
    monkeypatch.setattr(linear, "this_cpu_flags", lambda: frozenset(flags))


def _layer_inputs(rows: int):
    g = torch.Generator().manual_seed(rows)
    weight = torch.randn(48, 32, generator=g).bfloat16()
    bias = torch.randn(48, generator=g).bfloat16()
    x = torch.randn(rows, 32, generator=g).bfloat16()
    residual = torch.randn(rows, 48, generator=g).bfloat16()
    return weight, bias, x, residual


@pytest.mark.parametrize("with_extension", [True, False])
def test_bf16_without_native_products_multiplies_long_calls_in_float32(monkeypatch, with_extension):
    _emulated_bf16(monkeypatch, False)
    if not with_extension:
        torch_ops = CpuExtension("torch", "a test: torch's ops")
        monkeypatch.setattr(linear, "cpu_extension", lambda: torch_ops)
    weight, bias, _, _ = _layer_inputs(1)
    layer = Linear.build(weight, bias)
    if layer.fast_op is not None:  # the extension's loops to 64 rows, float32 past them
        assert layer.max_fast_rows == cpu_gemv.MAX_ROWS_BF16_NO_NATIVE
        assert layer.min_float32_rows == cpu_gemv.MAX_ROWS_BF16_NO_NATIVE + 1
    else:  # torch's bfloat16 product to 16 rows
        assert not with_extension or not linear.cpu_extension().is_extension
        assert layer.min_float32_rows == cpu_gemv.MAX_ROWS_BF16 + 1
    weight, bias, x, residual = _layer_inputs(layer.min_float32_rows)
    y = Linear.build(weight, bias)(x, residual)
    # one rounding, after the float32 product and both adds
    expected = (x.float() @ weight.float().t() + bias.float() + residual.float()).bfloat16()
    assert y.dtype == torch.bfloat16
    assert torch.equal(y, expected)


def test_bf16_with_native_products_stays_in_bf16(monkeypatch):
    _emulated_bf16(monkeypatch, True)
    weight, bias, x, _ = _layer_inputs(80)
    layer = Linear.build(weight, bias)
    assert layer.min_float32_rows is None
    expected = torch.addmm(bias, x, weight.t())
    assert torch.equal(layer(x), expected)


def test_float32_weights_never_take_the_float32_products_path(monkeypatch):
    _emulated_bf16(monkeypatch, False)
    weight = torch.randn(48, 32)
    assert Linear.build(weight).min_float32_rows is None
