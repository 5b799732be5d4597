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
The arithmetic lives in the kernels layer's Triton-free `kv_quant_reference`, which the Triton
kernels are checked against bit-exact.
"""

from __future__ import annotations

import torch

# One implementation for the engine and the kernels layer's checks (a Triton-free module).
from llmbench.kernels.kv_quant_reference import QMAX
from llmbench.kernels.kv_quant_reference import dequantize_reference as dequantize
from llmbench.kernels.kv_quant_reference import quantize_reference as quantize

__all__ = ["FLOAT_DTYPES", "QMAX", "dequantize", "quantize"]

FLOAT_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
