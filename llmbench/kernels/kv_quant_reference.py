"""The torch reference of the int8 / int4 K/V quantise pair, without Triton: the engine's K/V
storage format (`kv_quant` describes it) computed by the engine on every device, and what the
`kv_quant` kernels are checked against bit-exact. A module of its own so that using it does not
import Triton.
"""

from __future__ import annotations

import torch

QMAX = {"int8": 127, "int4": 7}
MIN_SCALE = 2.0**-24  # the smallest float16 (subnormal): a zero row still gets a scale


def quantize_reference(x: torch.Tensor, fmt: str) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., d] → (codes [..., d] int8 or [..., d/2] uint8, scales [...] float16)."""
    qmax = QMAX[fmt]
    xf = x.float()
    scales = (xf.abs().amax(-1) / qmax).clamp_(min=MIN_SCALE).to(torch.float16)
    codes = torch.round(xf / scales.float().unsqueeze(-1)).clamp_(-qmax, qmax)
    if fmt == "int8":
        return codes.to(torch.int8), scales
    nibbles = (codes + 8).to(torch.uint8)
    return nibbles[..., 0::2] | (nibbles[..., 1::2] << 4), scales


def dequantize_reference(
    codes: torch.Tensor, scales: torch.Tensor, fmt: str, dtype: torch.dtype
) -> torch.Tensor:
    """(codes, scales) of `quantize_reference` → values [..., d] in `dtype`."""
    if fmt == "int8":
        values = codes.to(dtype)
    else:
        pairs = torch.stack((codes & 15, codes >> 4), dim=-1)  # [..., d/2, 2]: low, high
        values = pairs.flatten(-2).to(dtype) - 8
    return values * scales.to(dtype).unsqueeze(-1)
