"""Quantise K/V rows to int8 or packed int4 codes, one scale per token and KV head, and back.

Pure functions over tensors: the reference that a fused kernel may replace. Symmetric, per row of
`head_dim` elements (one token's K or V in one KV head):

    scale = absmax(row) / qmax          (int8: qmax 127; int4: qmax 7)
    code  = clamp(round(row / scale), -qmax, qmax)
    row'  = code · scale                |row - row'| <= scale / 2 per element

int8 codes are stored as int8. int4 codes are stored + 8 (1..15) as nibbles, two per byte:
element 2i in the low nibble, 2i + 1 in the high one, so a row takes head_dim / 2 bytes.

Scales are float16, not float32: a scale per 64-element row costs 2 bytes instead of 4, i.e. 3%
instead of 6% on top of an int8 row and 6% instead of 12.5% on top of an int4 row. float16 keeps
11 significant bits, so rounding the scale moves a dequantised value by at most 2^-11 of the
row's absmax: 16x below int8's own step (absmax / 254) and 280x below int4's (absmax / 14).
Its range (up to 65,504 · qmax) is far beyond K/V magnitudes; a row with absmax below
qmax · 2^-24 (all but zero) gets the smallest float16 scale and dequantises to near zero.
Codes are computed from the float16 scale as stored, so `dequantize` reproduces them exactly.
"""

from __future__ import annotations

import torch

QMAX = {"int8": 127, "int4": 7}
FLOAT_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_MIN_SCALE = 2.0**-24  # the smallest float16 (subnormal): a zero row needs a non-zero scale


def quantize(x: torch.Tensor, fmt: str) -> tuple[torch.Tensor, torch.Tensor]:
    """x: [..., d] → (codes, scales): codes [..., d] int8 (int8) or [..., d/2] uint8 (int4),
    scales [...] float16."""
    qmax = QMAX[fmt]
    xf = x.float()
    scales = (xf.abs().amax(-1) / qmax).clamp_(min=_MIN_SCALE).to(torch.float16)
    codes = torch.round(xf / scales.float().unsqueeze(-1)).clamp_(-qmax, qmax)
    if fmt == "int8":
        return codes.to(torch.int8), scales
    nibbles = (codes + 8).to(torch.uint8)  # [..., d], 1..15
    return nibbles[..., 0::2] | (nibbles[..., 1::2] << 4), scales


def dequantize(
    codes: torch.Tensor, scales: torch.Tensor, fmt: str, dtype: torch.dtype
) -> torch.Tensor:
    """(codes, scales) from `quantize` → values [..., d] in `dtype`."""
    if fmt == "int8":
        values = codes.to(dtype)
    else:
        pairs = torch.stack((codes & 15, codes >> 4), dim=-1)  # [..., d/2, 2]: low, high
        values = pairs.flatten(-2).to(dtype) - 8
    return values * scales.to(dtype).unsqueeze(-1)
