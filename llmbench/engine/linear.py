"""The model's matrix multiplies: the float layer `Linear` and `make_linear`, which builds it or,
with a quantisation scheme, a quantised layer.

Every weight matrix of the model is one layer called `layer(x, residual=None)` → x @ W^T
(+ bias) (+ residual) that reports the bytes it holds (`num_bytes`). `Linear` keeps W in the
model's dtype and, on a CPU with the C++ extension, sends decode-sized calls to its matmul
(`kernels.cpu_gemv`); the quantised layers (int8, int4) are `quant.linear`'s, built by its
`quantize_linear`. This file picks between them; `quant/linear.py` only quantises.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from llmbench.engine.kernel_ops import cpu_extension
from llmbench.engine.quant.linear import QuantLinear, quantize_linear
from llmbench.engine.quant.scheme import QuantScheme
from llmbench.kernels import cpu_gemv
from llmbench.kernels.cpu_info import multiplies_in_float32, this_cpu_flags


@dataclass(frozen=True)
class Linear:
    """y = x @ W^T + bias (+ residual), with W kept in the layout that streams faster.

    `weight` is [out, in] as in the checkpoint, or its transpose [in, out] when
    `is_input_major`. Measured here (float32, 2 threads, one row, weights from DRAM), MKL reads
    a wide matrix faster input-major: [3072, 576] 20.7 vs 15.5 GB/s, [49152, 576] 22.0 vs 15.8;
    a tall one slower: [576, 1536] 13.9 vs 16.1. In 16 bits the native kernel wants [out, in].
    On a CPU with the C++ extension (any float dtype), calls of up to `max_fast_rows` rows run
    its matmul (`kernels.cpu_gemv`) instead, on [out, in]: one row through [3072, 576] bfloat16
    streamed 36.6 GB/s there vs 24.8 native (plain read 48.9), measured in one process; float32
    figures are at `cpu_gemv.MAX_ROWS_F32`. The input-major layout is then not used.

    bfloat16 on a CPU without bfloat16 products (`cpu_info.multiplies_in_float32`: AVX2 only), where
    torch's bfloat16 matmul runs at 16-20 GFLOP/s whatever the size: calls of `min_float32_rows`
    rows or more multiply in float32 (W converted each call, 6 bytes an element against 2·rows
    FLOPs: 137 GFLOP/s at a 2,048-row prefill chunk there, `cpu_gemv.MAX_ROWS_BF16_NO_NATIVE`
    has the rest), rounded once to bfloat16 after the adds.
    """

    weight: torch.Tensor
    bias: torch.Tensor | None = None
    is_input_major: bool = False
    # CPU: the C++ matmul of `kernels.cpu_gemv` (None: torch), for up to this many rows.
    fast_op: Callable[..., torch.Tensor] | None = None
    max_fast_rows: int = 0
    # From this many rows, products in float32 (None: in the weight's dtype).
    min_float32_rows: int | None = None

    @classmethod
    def build(cls, weight: torch.Tensor, bias: torch.Tensor | None = None) -> Linear:
        out_features, in_features = weight.shape
        dtype_name = str(weight.dtype).removeprefix("torch.")
        emulated_bf16 = multiplies_in_float32(dtype_name, weight.device.type, this_cpu_flags())
        if weight.device.type == "cpu" and weight.dtype in cpu_gemv.WEIGHT_DTYPES:
            backend = cpu_extension()
            if backend.is_extension:
                rows = cpu_gemv.max_rows(weight.dtype, backend.isa, not emulated_bf16)
                op = backend.op(cpu_gemv.OP)
                float32_rows = rows + 1 if emulated_bf16 else None
                return cls(
                    weight.contiguous(),
                    bias,
                    fast_op=op,
                    max_fast_rows=rows,
                    min_float32_rows=float32_rows,
                )
        if emulated_bf16:  # torch's one-row product beats converting W up to 16 rows
            return cls(weight, bias, min_float32_rows=cpu_gemv.MAX_ROWS_BF16 + 1)
        if weight.device.type == "cpu" and weight.dtype == torch.float32:
            if out_features > in_features:
                return cls(weight.t().contiguous(), bias, is_input_major=True)
        return cls(weight, bias)

    @property
    def num_bytes(self) -> int:
        total = self.weight.numel() * self.weight.element_size()
        return total + (
            self.bias.numel() * self.bias.element_size() if self.bias is not None else 0
        )

    def __call__(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        if self.fast_op is not None and x.shape[0] <= self.max_fast_rows:
            return self.fast_op(x, self.weight, self.bias, residual)
        w_t = self.weight if self.is_input_major else self.weight.t()  # [in, out]
        if self.min_float32_rows is not None and x.shape[0] >= self.min_float32_rows:
            y = torch.mm(x.float(), w_t.float())  # [rows, out] float32
            for add in (self.bias, residual):
                if add is not None:
                    y += add.float()
            return y.to(x.dtype)
        add = residual if residual is not None else self.bias
        if residual is not None and self.bias is not None:
            add = residual + self.bias
        return torch.mm(x, w_t) if add is None else torch.addmm(add, x, w_t)


def make_linear(
    weight: torch.Tensor, bias: torch.Tensor | None = None, quantize: QuantScheme | None = None
) -> Linear | QuantLinear:
    """The layer for one weight matrix [out, in]: a float `Linear`, or quantised at load to
    `quantize`'s scheme (`quant.linear`: int8 per output channel, int4 per group)."""
    if quantize is None:
        return Linear.build(weight, bias)
    extension = cpu_extension() if weight.device.type == "cpu" else None
    return quantize_linear(weight, bias, quantize, extension)
