"""Quantised linear layers: y = x @ dequant(W)^T (+ bias) (+ residual), W stored as int8 or int4.

They are called like the float layer `engine.linear.Linear` (`layer(x, residual=None)`) and
report the bytes they hold (`num_bytes`: codes, scales, zero points, bias). `quantize_linear`
builds the right one; `engine.linear.make_linear` calls it when the model is quantised, and
builds a `Linear` otherwise.

CPU with the C++ extension built for AVX2 or better (`ExtensionQuantLinear`,
`kernels.cpu_quant_gemv`: VPDPBUSD with AVX-512 VNNI, else AVX2's byte products): int8 and int4
(groups of 32) in the extension's layouts, x quantised per 32 to int8 in the call as llama.cpp
does; measured on an Intel Xeon (VNNI) at load ≈ 3 (three other jobs), the same 120 matrices at
one row: int4 6.4 ms vs torch's kernel 7.2, int8 6.9 vs 13.0; decode steps of the whole model
5.6 ms (int4) and 6.6 ms (int8) against 9.3 ms bfloat16. Other group sizes, and a scalar build
or none, take torch's kernels below.

CPU otherwise: torch's weight-only kernels, which want bfloat16 activations and scales (their
float32 and float16 paths are 8-30x slower here); a float32 or float16 model converts x on the
way in and y on the way out. Measured on this 2-core AMD EPYC (AVX-512 BF16/VNNI, no AMX), torch
2.13, 2 threads, load average 1.5 (one other job), the 120 matrices of SmolLM2-135M's 30 layers
in one pass, median of 7 (ms per pass; `python benchmarks/quant_kernels.py` repeats it):

    rows                                   1      2      4      8     16     32    128    512
    bfloat16 (`linear.Linear`: C++ GEMV  6.6    6.9    6.0    8.4   14.1   18.4   40.7    130
      up to 16 rows, else oneDNN)
    int8 _weight_int8pack_mm             4.5    4.3    5.1    8.1   14.4   26.0   99.5    382
    int8 → bf16 per call + oneDNN mm    12.2   16.7   16.7   18.5   20.6   25.7   61.4    174
    int4 _weight_int4pack_mm_for_cpu     3.4    3.7    4.4    7.6   13.1   23.7   89.2    359
    int4 → bf16 per call + oneDNN mm       -      -      -      -      -   87.2    119    224

So int8 runs the kernel up to `INT8_KERNEL_MAX_ROWS` rows and dequantises to bfloat16 for a
oneDNN matmul above (prefill); int4 always runs its kernel: dequantising wins only for
prefill chunks of several hundred tokens, and would need a second copy of the weights in
another layout. Left out, measured in other passes at one row: float32 / float16 activations
through the same kernels (37.8 and 42.5 ms against 4.9 for bfloat16, load 2.3); int8
activations quantised per call for `torch._int_mm` (10.3 ms, 13.9 at 32 rows: faster when
batched, but no longer weight-only); a plain AVX-512 C++ GEMV (codes → float32, FMA; with the
lm_head in the pass, int8 9.0 ms against torch's 6.6, int4 5.5 against 4.3).

Elsewhere (CUDA): the weights are dequantised to the model's dtype on every call and multiplied
with `torch.mm` (int4 from two codes per byte). That path is tested on the CPU only; it has not
run on a GPU.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from llmbench.engine.quant.codes import (
    INT4_OFFSET,
    pack_nibbles,
    quantize_int4,
    quantize_int8,
    unpack_nibbles,
)
from llmbench.engine.quant.scheme import QuantScheme
from llmbench.kernels import cpu_quant_gemv
from llmbench.kernels.cpu_extension import CpuExtension
from llmbench.kernels.cpu_info import multiplies_in_float32, this_cpu_flags

# The CPU kernels' activation and scale dtype.
CPU_COMPUTE_DTYPE = torch.bfloat16
# Up to this many rows the int8 kernel beats dequantise + oneDNN (table above: 14.4 vs 20.6 ms
# at 16 rows, even at 32).
INT8_KERNEL_MAX_ROWS = 16
# Up to this many rows the extension's matmul runs (x quantised to int8 per group of 32);
# above (prefill), its weight-only `quant_gemm`: a prompt's activations keep their precision.
# (Measured on the Intel Xeon with AMX, 2 threads, 40 of SmolLM2's layer matrices,
# int8: the VNNI matmul 3.7 ms at 16 rows, 6.9 at 32; bfloat16 oneDNN 4.7 and 7.0, plus
# dequantising, ~4 ms: a speed-only limit would sit near 64 rows. With the VNNI matmul up to
# 64 rows, int8 greedy decoding of SmolLM2 left float32's 5 tokens earlier on one prompt. With
# AMX, `quant_gemm` overtakes the VNNI matmul between 12 and 16 rows: the 120 matrices at 16
# rows 12.6 against 14.3 ms int8, 9.8 against 13.2 int4, at 8 rows 13.5 against 9.6 and 10.1
# against 7.8: too small a gain for a second limit.)
QUANT_GEMV_MAX_ROWS = 16
# `_convert_weight_to_int4pack_for_cpu` wants a multiple of 16 output rows.
INT4_ROW_MULTIPLE = 16
# `_weight_int8pack_mm` reads the input dimension 16 values at a time: with another in_features
# it returns garbage at one row and crashes (SIGSEGV) at more (torch 2.13, measured K = 8, 24,
# 200, 1000). Such codes get zero columns up to a multiple of 16, and x zeros to match.
INT8_IN_MULTIPLE = 16


def _tensor_bytes(*tensors: torch.Tensor | None) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


def _finish(
    y: torch.Tensor, dtype: torch.dtype, bias: torch.Tensor | None, residual: torch.Tensor | None
) -> torch.Tensor:
    """y in the model's dtype, plus the bias and the residual (in place: y is fresh)."""
    y = y.to(dtype)
    if bias is not None:
        y += bias
    if residual is not None:
        y += residual
    return y


@dataclass(frozen=True)
class Int8Linear:
    """Per-output-channel int8: codes [out, in_padded] (zero columns up to a multiple of 16),
    scale [out] (bfloat16 on CPU, else the model's dtype); y = (x @ codes^T) · scale."""

    codes: torch.Tensor
    scale: torch.Tensor
    in_features: int
    bias: torch.Tensor | None = None
    # Dequantised products in float32, not the compute dtype: bfloat16 on a CPU without
    # bfloat16 products, as `engine.linear.Linear` multiplies there.
    is_float32_products: bool = False

    @property
    def num_bytes(self) -> int:
        return _tensor_bytes(self.codes, self.scale, self.bias)

    def __call__(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        xc = x.to(self.scale.dtype)  # [T, in]
        if self.codes.shape[1] != self.in_features:
            xc = F.pad(xc, (0, self.codes.shape[1] - self.in_features))
        if xc.device.type == "cpu" and xc.shape[0] <= INT8_KERNEL_MAX_ROWS:
            y = torch.ops.aten._weight_int8pack_mm(xc, self.codes, self.scale)
        else:  # dequantise per call: the codes in the compute dtype, the scale after the matmul
            dtype = torch.float32 if self.is_float32_products else xc.dtype
            y = torch.mm(xc.to(dtype), self.codes.to(dtype).t()).mul_(self.scale)
        return _finish(y, x.dtype, self.bias, residual)  # [T, out]


@dataclass(frozen=True)
class PackedInt4Linear:
    """Group-wise int4 in the CPU kernel's layout: `packed` from
    `_convert_weight_to_int4pack_for_cpu` ([out_padded, in_padded / 2] uint8), `scale_zero`
    [groups, out_padded, 2] bfloat16 (scale, zero: w = (q − 8)·scale + zero, symmetric schemes
    store zeros too). Rows are padded to a multiple of 16, columns to whole groups (x is padded
    with zeros to match)."""

    packed: torch.Tensor
    scale_zero: torch.Tensor
    group_size: int
    in_features: int
    out_features: int
    bias: torch.Tensor | None = None

    @property
    def num_bytes(self) -> int:
        return _tensor_bytes(self.packed, self.scale_zero, self.bias)

    def __call__(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        xc = x.to(CPU_COMPUTE_DTYPE)  # [T, in]
        pad = self.scale_zero.shape[0] * self.group_size - self.in_features
        if pad:
            xc = F.pad(xc, (0, pad))
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(
            xc, self.packed, self.group_size, self.scale_zero
        )
        if y.shape[1] != self.out_features:
            y = y[:, : self.out_features]
        return _finish(y, x.dtype, self.bias, residual)  # [T, out]


@dataclass(frozen=True)
class Int4Linear:
    """Group-wise int4 for any device: `packed` [out, in_padded / 2] (two codes per byte,
    `pack_nibbles`), `scale` and `zero` [out, groups] in the model's dtype (zero None when
    symmetric); dequantised to the model's dtype on every call."""

    packed: torch.Tensor
    scale: torch.Tensor
    zero: torch.Tensor | None
    group_size: int
    in_features: int
    bias: torch.Tensor | None = None

    @property
    def num_bytes(self) -> int:
        return _tensor_bytes(self.packed, self.scale, self.zero, self.bias)

    def dequantize(self) -> torch.Tensor:
        """W [out, in] in the model's dtype: scale · (q − 8) + zero per group."""
        num_out, num_groups = self.scale.shape
        q = unpack_nibbles(self.packed).to(self.scale.dtype).view(num_out, num_groups, -1)
        w = (q - INT4_OFFSET) * self.scale[..., None]
        if self.zero is not None:
            w += self.zero[..., None]
        return w.view(num_out, -1)[:, : self.in_features]

    def __call__(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        y = torch.mm(x, self.dequantize().t())  # [T, out]
        return _finish(y, x.dtype, self.bias, residual)


@dataclass(frozen=True)
class ExtensionQuantLinear:
    """int8 (per output channel) or int4 (group 32) in the C++ extension's layouts
    (`kernels.cpu_quant_gemv`: `scale_zero` for int4, `scale` for int8), for a build with
    AVX2 or better. Up to `QUANT_GEMV_MAX_ROWS` rows through the extension's matmul (x
    quantised per 32 to int8 on the way in, as llama.cpp does); above (prefill), its
    weight-only `quant_gemm` (bfloat16 x: W dequantised a block at a time in cache, met on the
    AMX tiles, on AVX-512 BF16 vectors or, on AVX2, on float32 panels; float32 or float16 x:
    dequantised whole per call)."""

    codes: torch.Tensor
    scale_zero: torch.Tensor | None
    scale: torch.Tensor | None
    in_features: int
    out_features: int
    op: Callable[..., torch.Tensor]
    gemm_op: Callable[..., torch.Tensor]  # the extension's `quant_gemm`
    bias: torch.Tensor | None = None

    @property
    def num_bytes(self) -> int:
        return _tensor_bytes(self.codes, self.scale_zero, self.scale, self.bias)

    def dequantize(self) -> torch.Tensor:
        """W [out, in] in float32."""
        n, k = self.out_features, self.in_features
        if self.scale_zero is not None:
            return cpu_quant_gemv.dequantize_int4_blocks(self.codes, self.scale_zero, n, k)
        return cpu_quant_gemv.dequantize_int8_blocks(self.codes, self.scale, n, k)

    def __call__(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        op = self.op if x.shape[0] <= QUANT_GEMV_MAX_ROWS else self.gemm_op
        layout = (self.codes, self.scale_zero, self.scale, self.out_features)
        return op(x, *layout, self.bias, residual)


QuantLinear = Int8Linear | PackedInt4Linear | Int4Linear | ExtensionQuantLinear


def quantize_linear(
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    scheme: QuantScheme,
    cpu_extension: CpuExtension | None = None,
) -> QuantLinear:
    """The quantised layer for weight [out, in] (and its bias, kept in the model's dtype): on a
    CPU the extension's layouts where it has its int8/int4 matmul (int8, int4 in groups of 32),
    else torch's CPU kernels' layouts; the dequantise-per-call layouts elsewhere."""
    is_cpu = weight.device.type == "cpu"
    has_kernel = is_cpu and cpu_extension is not None and cpu_extension.has_quant_gemv
    if has_kernel and (scheme.bits == 8 or scheme.group_size == cpu_quant_gemv.GROUP):
        ops = (cpu_extension.op(cpu_quant_gemv.OP), cpu_extension.op(cpu_quant_gemv.GEMM_OP))
        return extension_layer(weight, bias, scheme, *ops)
    if scheme.bits == 8:
        return int8_layer(weight, bias, CPU_COMPUTE_DTYPE if is_cpu else weight.dtype)
    if is_cpu:
        return packed_int4_layer(weight, bias, scheme)
    return int4_layer(weight, bias, scheme)


def extension_layer(
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    scheme: QuantScheme,
    op: Callable[..., torch.Tensor],
    gemm_op: Callable[..., torch.Tensor],
) -> ExtensionQuantLinear:
    """The layer in the extension's layouts: int8 scales float32, int4 scales and zero points
    float16 (the codes rounded against the stored values, as `quantize_int4` does)."""
    num_out, num_in = weight.shape
    if scheme.bits == 8:
        codes, scale = quantize_int8(weight, torch.float32)
        packed, scale = cpu_quant_gemv.pack_int8(codes, scale)
        return ExtensionQuantLinear(packed, None, scale, num_in, num_out, op, gemm_op, bias)
    q = quantize_int4(weight, scheme.group_size, scheme.has_zero, torch.float16)
    packed, scale_zero = cpu_quant_gemv.pack_int4(q.codes, q.scale, q.zero)
    return ExtensionQuantLinear(packed, scale_zero, None, num_in, num_out, op, gemm_op, bias)


def int8_layer(
    weight: torch.Tensor, bias: torch.Tensor | None, scale_dtype: torch.dtype
) -> Int8Linear:
    """Per-output-channel int8 codes, in columns padded to a multiple of 16 (what the CPU
    kernel can read), scales in `scale_dtype`."""
    codes, scale = quantize_int8(weight, scale_dtype)
    num_in = weight.shape[1]
    padded_in = -(-num_in // INT8_IN_MULTIPLE) * INT8_IN_MULTIPLE
    scale_name = str(scale_dtype).removeprefix("torch.")
    is_float32 = multiplies_in_float32(scale_name, weight.device.type, this_cpu_flags())
    padded = F.pad(codes, (0, padded_in - num_in))
    return Int8Linear(padded, scale.to(scale_dtype), num_in, bias, is_float32)


def _int4_codes(weight: torch.Tensor, scheme: QuantScheme, scale_dtype: torch.dtype):
    """`quantize_int4` with the codes padded to whole groups: (codes [out, G·group], q)."""
    q = quantize_int4(weight, scheme.group_size, scheme.has_zero, scale_dtype)
    num_groups = q.scale.shape[1]
    codes = F.pad(q.codes, (0, num_groups * scheme.group_size - weight.shape[1]))
    return codes, q


def int4_layer(weight: torch.Tensor, bias: torch.Tensor | None, scheme: QuantScheme) -> Int4Linear:
    """The dequantise-per-call int4 layer (any device), scales in the weight's dtype."""
    codes, q = _int4_codes(weight, scheme, weight.dtype)
    zero = q.zero.to(weight.dtype) if scheme.has_zero else None
    return Int4Linear(
        pack_nibbles(codes), q.scale.to(weight.dtype), zero, q.group_size, weight.shape[1], bias
    )


def packed_int4_layer(
    weight: torch.Tensor, bias: torch.Tensor | None, scheme: QuantScheme
) -> PackedInt4Linear:
    """The int4 layer in the CPU kernel's layout: rows padded to a multiple of 16 (code 0,
    scale 0: they compute 0 and are cut off), bfloat16 scales and zero points."""
    codes, q = _int4_codes(weight, scheme, CPU_COMPUTE_DTYPE)
    num_out, num_in = weight.shape
    extra_rows = -(-num_out // INT4_ROW_MULTIPLE) * INT4_ROW_MULTIPLE - num_out
    codes = F.pad(codes, (0, 0, 0, extra_rows))
    scale, zero = (F.pad(t, (0, 0, 0, extra_rows)) for t in (q.scale, q.zero))
    # The kernel computes (q − 8)·scale + zero per group: the form `quantize_int4` fits.
    scale_zero = torch.stack((scale.t(), zero.t()), dim=2).to(CPU_COMPUTE_DTYPE).contiguous()
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes.to(torch.int32), 1)
    return PackedInt4Linear(packed, scale_zero, q.group_size, num_in, num_out, bias)
