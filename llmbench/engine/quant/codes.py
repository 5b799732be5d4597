"""Quantise and dequantise weight matrices [out, in]: pure functions, float32 maths.

Scales (and int4 zero points) come back as float32 tensors whose values are exactly
representable in `scale_dtype`, the dtype the layer stores them in (the CPU kernels take
bfloat16 scales), and the codes are rounded against those stored values. Each scale is rounded
*up* to `scale_dtype` and each zero point placed first, so no weight falls outside the range
its codes cover, nothing is clamped, and every weight dequantises to within half a step:

    |w − dequantize(quantize(w))| ≤ scale / 2   (per element, its own row's or group's scale)

up to float32 rounding of the dequantisation itself.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

INT8_MAX = 127  # codes in [-127, 127]: symmetric, -128 unused
INT4_OFFSET = 8  # 4-bit codes q in [0, 15] stand for q - 8 in [-8, 7]
INT4_MAX = 15


def _round_up_to(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The smallest value representable in `dtype` that is >= x (x >= 0), as float32."""
    r = x.to(dtype)
    bumped = torch.nextafter(r, torch.full_like(r, math.inf))
    return torch.where(r.float() < x, bumped, r).float()


def _nonzero(scale: torch.Tensor) -> torch.Tensor:
    """A scale of 0 (a row or group of zeros, all codes 0 or 8) becomes 1: no division by 0."""
    return torch.where(scale > 0, scale, torch.ones_like(scale))


def quantize_int8(
    w: torch.Tensor, scale_dtype: torch.dtype = torch.float32
) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric per-output-channel int8: (codes int8 [out, in], scale float32 [out]).

    Formula: scale = roundup(max |w[row]| / 127), q = round(w / scale), w ≈ scale · q.
    |w / scale| ≤ 127, so no code is clamped.
    """
    w = w.float()
    scale = _nonzero(_round_up_to(w.abs().amax(dim=1) / INT8_MAX, scale_dtype))
    codes = torch.round(w / scale[:, None]).clamp_(-INT8_MAX, INT8_MAX).to(torch.int8)
    return codes, scale


def dequantize_int8(codes: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Formula: w = scale[row] · q, in float32 [out, in]."""
    return codes.float() * scale.float()[:, None]


@dataclass(frozen=True)
class Int4Codes:
    """A matrix [out, in] in int4 groups: `codes` uint8 [out, in] (values 0..15), `scale` and
    `zero` float32 [out, ceil(in / group_size)]; w ≈ scale · (q − 8) + zero per group (the
    last group of a row may be partial). Symmetric: zero is all 0."""

    codes: torch.Tensor
    scale: torch.Tensor
    zero: torch.Tensor
    group_size: int


def quantize_int4(
    w: torch.Tensor,
    group_size: int,
    has_zero: bool,
    scale_dtype: torch.dtype = torch.float32,
) -> Int4Codes:
    """Group-wise int4 of w [out, in], symmetric or with a zero point per group.

    Formula (per group of `group_size` weights of a row, min/max over the group):
      symmetric:  zero = 0, scale = roundup(max(max / 7, −min / 8))
      asymmetric: zero = round((8 · max + 7 · min) / 15) (the level 8 steps above the group's
                  min, for a span of 15 steps), scale = roundup(max((max − zero) / 7,
                  (zero − min) / 8))
      q = round((w − zero) / scale) + 8, w ≈ scale · (q − 8) + zero.
    Either way (w − zero) / scale ∈ [−8, 7]: no code is clamped.
    """
    w = w.float()
    num_out, num_in = w.shape
    num_groups = -(-num_in // group_size)
    # A partial last group is padded by repeating its last column: its min and max stay its own.
    padded = F.pad(w[None], (0, num_groups * group_size - num_in), mode="replicate")[0]
    groups = padded.view(num_out, num_groups, group_size)
    low, high = groups.amin(dim=2), groups.amax(dim=2)  # [out, G]
    if has_zero:
        zero = ((INT4_MAX - INT4_OFFSET + 1) * high + (INT4_OFFSET - 1) * low) / INT4_MAX
        zero = zero.to(scale_dtype).float()
    else:
        zero = torch.zeros_like(low)
    # max/7 covers the 7 levels above the zero point, −min/8 the 8 below it.
    above, below = (high - zero) / (INT4_MAX - INT4_OFFSET), (zero - low) / INT4_OFFSET
    scale = _nonzero(_round_up_to(torch.maximum(above, below).clamp_(min=0), scale_dtype))
    q = torch.round((groups - zero[..., None]) / scale[..., None]) + INT4_OFFSET
    codes = q.clamp_(0, INT4_MAX).to(torch.uint8).view(num_out, -1)[:, :num_in]
    return Int4Codes(codes.contiguous(), scale, zero, group_size)


def dequantize_int4(q: Int4Codes) -> torch.Tensor:
    """Formula: w = scale · (q − 8) + zero per group, in float32 [out, in]."""
    num_in = q.codes.shape[1]
    scale = q.scale.repeat_interleave(q.group_size, dim=1)[:, :num_in]
    zero = q.zero.repeat_interleave(q.group_size, dim=1)[:, :num_in]
    return scale * (q.codes.float() - INT4_OFFSET) + zero


def pack_nibbles(codes: torch.Tensor) -> torch.Tensor:
    """uint8 codes [out, in] (0..15, `in` even) → [out, in / 2]: column 2j in the low nibble of
    byte j, column 2j + 1 in the high one."""
    return codes[:, 0::2] | (codes[:, 1::2] << 4)


def unpack_nibbles(packed: torch.Tensor) -> torch.Tensor:
    """The inverse of `pack_nibbles`: [out, in / 2] → uint8 codes [out, in]."""
    return torch.stack((packed & 0xF, packed >> 4), dim=2).view(packed.shape[0], -1)
