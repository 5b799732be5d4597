"""The 16-bit and float32 decode matmul of the CPU C++ extension: checks, reference, cost.

    y[M, N] = x[M, K] @ W[N, K]^T (+ bias[N]) (+ residual[M, N])   W bfloat16, float16 or
                                                                    float32, float32 sums,
                                                                    y in x's dtype

torch's own bfloat16 one-row product streams W at about half this machine's read bandwidth
(float32 through MKL at about 40%);
`csrc/gemv.cpp` streams each row of W once (VDPBF16PS where the CPU has AVX512_BF16) and is
the CPU fast path for rows <= `max_rows` (decode). It is the op `gemv` of the library
`cpu_extension` builds and loads (which also decides, through LLMBENCH_CPU_EXTENSION, whether
the extension is used at all).
"""

from __future__ import annotations

import torch

from llmbench.kernels.checks import (
    CPU,
    check_bias_and_residual,
    check_same_dtype,
    check_shape,
    check_tensor,
)
from llmbench.kernels.cost import KernelCost, dtype_bytes
from llmbench.kernels.cpu_extension import CpuExtension

OP = "gemv"  # the library's op, and the name its checks give
WEIGHT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
# Up to this many rows of x the extension beats torch's matmul (`max_rows`). bfloat16: measured
# by `benchmarks/cpu_gemv.py --rows` (ext vs native and oneDNN), at SmolLM2's shapes from DRAM,
# 2 threads: on the AMD EPYC (AVX-512 BF16, no AMX) the extension's loops (4 rows of x a pass)
# win up to 16 rows. From 16 rows a build with AVX-512 BF16 multiplies on panels of W, one row
# of W a lane (`csrc/gemm_vectors.cpp`), or, on the Intel Xeon with AMX from 2 rows, on the
# tiles (`csrc/gemv_amx.cpp`): both beat oneDNN to 64 rows (tiles: gate_up 22.0 GB/s against
# oneDNN's 11.7 at 8 rows, 17.4 against 10.6 at 32, 11.3 against 8.8 at 64; panels, the
# model's 120 matrices with the AMX-less path forced on the Xeon: 37-42 against 42-49 ms at 16
# rows, 60-64 against 64-66 at 32, 103 against 104-115 at 64). float16: always (torch has no
# fast float16 CPU matmul: ~0.3 GFLOP/s here); float32: SmolLM2-135M's 120 layer matrices from
# DRAM, 2 threads, at load ≈ 2.5 (tests running), best of 10: 8.4 ms (50 GB/s) vs 19.5 for MKL
# on the input-major layout at one row, 9.7 vs 36.0 at 4, 15.5 vs 43.1 at 16.
# On a CPU without bfloat16 products (`cpu_info.has_native_bf16`: AVX2 only, a 2-core AMD EPYC,
# 2026-11-28) torch's bfloat16 matmul ran at 16-20 GFLOP/s at every size, the extension's AVX2
# loops at about 70 from 4 rows, and float32 products (W converted each call, what the model
# runs past this limit: `engine.linear.Linear`) at 25, 40, 57 and 98 GFLOP/s at 17, 32, 64 and
# 256 rows (x @ W [3072, 576]^T): the extension wins to about 64 rows.
MAX_ROWS_BF16 = 16
MAX_ROWS_BF16_PANELS = 64
MAX_ROWS_BF16_NO_NATIVE = 64
MAX_ROWS_F16 = 1 << 30
MAX_ROWS_F32 = 16


def max_rows(dtype: torch.dtype, isa: str, has_native_bf16: bool = True) -> int:
    """The most rows of x for which the model calls the extension instead of torch, for an
    extension built for `isa` (`CpuExtension.isa`: "avx512bf16…" multiplies bfloat16 on the
    tiles or on panels) on a CPU with or without bfloat16 products (`has_native_bf16`:
    without, torch's bfloat16 matmul is slower than the extension's loops to 64 rows)."""
    if isa.startswith("avx512bf16"):
        bf16 = MAX_ROWS_BF16_PANELS
    else:
        bf16 = MAX_ROWS_BF16 if has_native_bf16 else MAX_ROWS_BF16_NO_NATIVE
    return {torch.bfloat16: bf16, torch.float32: MAX_ROWS_F32}.get(dtype, MAX_ROWS_F16)


def check_gemv_args(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    residual: torch.Tensor | None = None,
) -> None:
    """Raise KernelArgumentError naming the argument unless the layout is what the op reads."""
    check_tensor(OP, "weight", weight, "[N, K]", WEIGHT_DTYPES, contiguous_dims=2, device=CPU)
    check_tensor(OP, "x", x, "[M, K]", WEIGHT_DTYPES, device=CPU)
    check_same_dtype(OP, "x", x, "weight", weight.dtype)
    num_rows, out_features = x.shape[0], weight.shape[0]
    check_shape(OP, "x", x, (num_rows, weight.shape[1]), "[M, K]")
    check_bias_and_residual(OP, x, out_features, bias, residual)


def gemv(
    backend: CpuExtension,
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    residual: torch.Tensor | None = None,
) -> torch.Tensor:
    """x [M, K] @ weight[N, K]^T (+ bias) (+ residual) → [M, N] through the extension, checked."""
    check_gemv_args(x, weight, bias, residual)
    return backend.op(OP)(x, weight, bias, residual)


def gemv_reference(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    residual: torch.Tensor | None = None,
) -> torch.Tensor:
    """The same product in float32, the adds included, rounded once to x's dtype."""
    y = x.float() @ weight.float().t()
    if bias is not None:
        y = y + bias.float()
    if residual is not None:
        y = y + residual.float()
    return y.to(x.dtype)


def gemv_cost(
    num_rows: int,
    out_features: int,
    in_features: int,
    dtype: object,
    has_bias: bool = False,
    has_residual: bool = False,
) -> KernelCost:
    """Bytes and FLOPs of one call.

    Formula: bytes = e·(N·K + M·K + M·N + [bias] N + [residual] M·N), flops = 2·M·N·K
    (+ M·N per add), with e the bytes per element of the 16-bit dtype.
    """
    e = dtype_bytes(dtype)
    m, n, k = num_rows, out_features, in_features
    elements = n * k + m * k + m * n + (n if has_bias else 0) + (m * n if has_residual else 0)
    flops = 2 * m * n * k + (m * n if has_bias else 0) + (m * n if has_residual else 0)
    return KernelCost(int(elements * e), flops)
