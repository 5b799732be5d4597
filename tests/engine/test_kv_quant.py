"""llmbench.engine.kv_quant: int8 and packed int4 K/V rows, one float16 scale per row."""

from __future__ import annotations

import pytest
import torch

from llmbench.engine.kv_quant import QMAX, dequantize, quantize


def max_error(absmax: torch.Tensor, fmt: str) -> torch.Tensor:
    """The largest |x - x'| a row of this absmax may show: half a step of the float16 scale
    (rounded up by at most 2^-11), or, when rounding the scale down pushes the largest element
    past qmax and it is clamped, 2^-11 of the absmax; plus float32 rounding."""
    scale = absmax / QMAX[fmt]
    return scale / 2 * (1 + 2.0**-11) + absmax * (2.0**-11 + 2.0**-20)


def random_rows(seed: int, shape=(257, 3, 64)) -> torch.Tensor:
    """K/V-like rows: normal values with a few large outliers, never zero rows."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g)
    x[..., 5] *= 20  # an outlier channel, as keys have
    return x


@pytest.mark.parametrize("fmt", ["int8", "int4"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_round_trip_error_is_within_half_a_step_of_each_row(fmt, seed):
    x = random_rows(seed)
    codes, scales = quantize(x, fmt)
    back = dequantize(codes, scales, fmt, torch.float32)
    assert back.shape == x.shape
    bound = max_error(x.abs().amax(-1), fmt)  # [257, 3]
    error = (back - x).abs().amax(-1)
    assert (error <= bound).all(), (error / bound).max()
    # The bound is tight: some row comes within 20% of half a step.
    assert (error / bound).max() > 0.8


@pytest.mark.parametrize(("fmt", "relative_rms"), [("int8", 0.0023), ("int4", 0.042)])
def test_round_trip_rms_error_per_scheme(fmt, relative_rms):
    """Uniform rounding error: RMS = step / sqrt(12), step = absmax / qmax; for normal rows of
    64 elements (absmax ~ 2.4 sigma) int8 gives ~0.0055 sigma, int4 ~0.1 sigma."""
    x = torch.randn(4096, 64, generator=torch.Generator().manual_seed(3))
    codes, scales = quantize(x, fmt)
    back = dequantize(codes, scales, fmt, torch.float32)
    rms = ((back - x) ** 2).mean().sqrt() / x.abs().amax(-1).mean()
    assert rms == pytest.approx(relative_rms, rel=0.15)


def test_int8_codes_and_scale_by_hand():
    x = torch.tensor([[1.27, -0.635, 0.0, 0.3]])
    codes, scales = quantize(x, "int8")
    assert scales.dtype == torch.float16 and codes.dtype == torch.int8
    scale = float(torch.tensor(1.27 / 127).half())
    assert scales.tolist() == [scale]
    assert codes.tolist() == [[round(1.27 / scale), round(-0.635 / scale), 0, round(0.3 / scale)]]
    # The float16 scale is 0.0100021..., a hair above 0.01: -0.635 is code -63 (-63.49), not -64.
    assert codes.tolist() == [[127, -63, 0, 30]]


def test_int4_packs_two_codes_per_byte_low_nibble_first():
    x = torch.tensor([[0.7, -0.7, 0.1, 0.3, -0.2, 0.0]])  # absmax 0.7: scale 0.1, qmax 7
    codes, scales = quantize(x, "int4")
    assert codes.dtype == torch.uint8 and codes.shape == (1, 3)
    # codes 7, -7, 1, 3, -2, 0 stored + 8: 15, 1, 9, 11, 6, 8; pairs (low, high).
    assert codes.tolist() == [[15 | 1 << 4, 9 | 11 << 4, 6 | 8 << 4]]
    back = dequantize(codes, scales, "int4", torch.float32)
    expected = torch.tensor([[7, -7, 1, 3, -2, 0]]) * scales.float()
    assert torch.equal(back, expected)


@pytest.mark.parametrize("fmt", ["int8", "int4"])
def test_zero_row_survives_and_stays_zero(fmt):
    x = torch.zeros(2, 8)
    codes, scales = quantize(x, fmt)
    assert (scales > 0).all()
    assert torch.equal(dequantize(codes, scales, fmt, torch.float32), x)


@pytest.mark.parametrize("fmt", ["int8", "int4"])
def test_bfloat16_input_and_output(fmt):
    x = random_rows(4, (64, 2, 16)).bfloat16()
    codes, scales = quantize(x, fmt)
    back = dequantize(codes, scales, fmt, torch.bfloat16)
    assert back.dtype == torch.bfloat16
    # bfloat16 adds its own rounding (2^-9 of each value) to the bound.
    bound = max_error(x.float().abs().amax(-1), fmt) + x.float().abs().amax(-1) * 2.0**-8
    assert ((back.float() - x.float()).abs().amax(-1) <= bound).all()
