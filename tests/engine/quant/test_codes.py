"""Quantise → dequantise: hand-computed codes, and the half-step error bound per scheme."""

from __future__ import annotations

import pytest
import torch

from llmbench.engine.quant.codes import (
    Int4Codes,
    dequantize_int4,
    dequantize_int8,
    pack_nibbles,
    quantize_int4,
    quantize_int8,
    unpack_nibbles,
)

# Float32 dequantisation rounds once or twice: allow that much above the exact half step.
ROUNDING = 1e-6


def _weights(num_out: int, num_in: int, seed: int) -> torch.Tensor:
    """Gaussian rows at different scales, a few outliers, and an all-zero row."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(num_out, num_in, generator=g) * torch.logspace(-3, 0, num_out)[:, None]
    w[1, 5] = 3.0  # an outlier widens its row's (and group's) step
    w[2] = 0.0
    return w


def test_int8_hand_example():
    # max |w| = 2.54 → scale 2.54 / 127 = 0.02; codes w / 0.02.
    codes, scale = quantize_int8(torch.tensor([[2.54, -1.0, 0.02, 0.0]]))
    assert codes.tolist() == [[127, -50, 1, 0]]
    assert scale.item() == pytest.approx(0.02)
    assert dequantize_int8(codes, scale)[0].tolist() == pytest.approx([2.54, -1.0, 0.02, 0.0])


@pytest.mark.parametrize("scale_dtype", [torch.float32, torch.bfloat16])
def test_int8_error_is_at_most_half_a_step(scale_dtype):
    w = _weights(16, 200, seed=0)
    codes, scale = quantize_int8(w, scale_dtype)
    assert codes.dtype == torch.int8 and codes.abs().max() <= 127
    # Scales are stored in scale_dtype exactly, and never below max|w| / 127 (no clamping).
    assert torch.equal(scale.to(scale_dtype).float(), scale)
    assert (scale * 127 >= w.abs().amax(dim=1)).all()
    error = (w - dequantize_int8(codes, scale)).abs()
    assert (error <= scale[:, None] / 2 * (1 + ROUNDING)).all()
    assert error[2].max() == 0  # the zero row stays zero


def test_int4_symmetric_hand_example():
    # One group of 4: max 7, min -8 → scale max(7/7, 8/8) = 1, zero 0, q = w / 1 + 8.
    q = quantize_int4(torch.tensor([[7.0, -8.0, 3.0, 0.0]]), group_size=4, has_zero=False)
    assert q.codes.tolist() == [[15, 0, 11, 8]]
    assert q.scale.tolist() == [[1.0]] and q.zero.tolist() == [[0.0]]
    assert dequantize_int4(q).tolist() == [[7.0, -8.0, 3.0, 0.0]]


def test_int4_zero_point_hand_example():
    # min 1, max 16: zero = (8·16 + 7·1) / 15 = 9, scale = max((16 − 9)/7, (9 − 1)/8) = 1,
    # q = round(w − 9) + 8; 2.5 sits half-way and rounds to even (−6.5 → −6).
    q = quantize_int4(torch.tensor([[1.0, 2.5, 16.0, 4.0]]), group_size=4, has_zero=True)
    assert q.zero.tolist() == [[9.0]] and q.scale.tolist() == [[1.0]]
    assert q.codes.tolist() == [[0, 2, 15, 3]]
    assert dequantize_int4(q).tolist() == [[1.0, 3.0, 16.0, 4.0]]


@pytest.mark.parametrize("group_size", [32, 64, 128])
@pytest.mark.parametrize("has_zero", [False, True])
@pytest.mark.parametrize("scale_dtype", [torch.float32, torch.bfloat16])
def test_int4_error_is_at_most_half_a_step(group_size, has_zero, scale_dtype):
    w = _weights(24, 200, seed=1)  # 200 columns: a partial last group for every size
    q = quantize_int4(w, group_size, has_zero, scale_dtype)
    num_groups = -(-200 // group_size)
    assert q.codes.shape == (24, 200) and q.scale.shape == q.zero.shape == (24, num_groups)
    assert q.codes.dtype == torch.uint8 and q.codes.max() <= 15
    assert torch.equal(q.scale.to(scale_dtype).float(), q.scale)
    assert torch.equal(q.zero.to(scale_dtype).float(), q.zero)
    if not has_zero:
        assert (q.zero == 0).all()
    step = q.scale.repeat_interleave(group_size, dim=1)[:, :200]
    error = (w - dequantize_int4(q)).abs()
    assert (error <= step / 2 * (1 + ROUNDING) + 1e-12).all()
    assert error[2].max() == 0


def test_int4_partial_group_is_scaled_by_its_own_columns():
    # 40 columns in groups of 32: the last group (8 columns) holds small values only.
    w = torch.cat([torch.full((1, 32), 7.0), torch.full((1, 8), 0.7)], dim=1)
    w[0, 0] = -8.0
    w[0, 32] = -0.8
    q = quantize_int4(w, group_size=32, has_zero=False)
    assert q.scale[0].tolist() == pytest.approx([1.0, 0.1])
    assert dequantize_int4(q)[0].tolist() == pytest.approx(w[0].tolist())


def test_int4_with_zero_points_reproduces_gguf_q4_1_blocks():
    """Q4_1 stores w = d·q + m, q in 0..15, per block of 32: int4:32 recovers it exactly."""
    g = torch.Generator().manual_seed(2)
    d = torch.rand(8, 4, 1, generator=g) * 0.01 + 1e-3  # 8 rows of 4 blocks
    m = torch.randn(8, 4, 1, generator=g) * 0.05
    q = torch.randint(0, 16, (8, 4, 32), generator=g).float()
    q[..., 0], q[..., 1] = 0, 15  # every block spans all 16 levels, as Q4_1's quantiser makes it
    w = (d * q + m).view(8, 128)
    back = dequantize_int4(quantize_int4(w, group_size=32, has_zero=True))
    assert torch.allclose(back, w, rtol=0, atol=1e-7)


def test_nibbles_round_trip():
    codes = torch.randint(0, 16, (5, 64), dtype=torch.uint8)
    packed = pack_nibbles(codes)
    assert packed.shape == (5, 32)
    assert packed[0, 0].item() == codes[0, 0].item() | (codes[0, 1].item() << 4)
    assert torch.equal(unpack_nibbles(packed), codes)


def test_dequantize_int4_is_the_formula():
    q = Int4Codes(
        codes=torch.tensor([[0, 8, 15, 3]], dtype=torch.uint8),
        scale=torch.tensor([[0.5, 2.0]]),
        zero=torch.tensor([[1.0, -1.0]]),
        group_size=2,
    )
    # scale · (q − 8) + zero: 0.5·(−8) + 1, 0.5·0 + 1, 2·7 − 1, 2·(−5) − 1
    assert dequantize_int4(q).tolist() == [[-3.0, 1.0, 13.0, -11.0]]
