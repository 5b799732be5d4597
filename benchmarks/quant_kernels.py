"""The weight-only matmul paths `quant.linear` chooses between, timed at SmolLM2-135M's shapes.

    python benchmarks/quant_kernels.py [--rows 1 2 4 8 16 32 128 512] [--repeats 5]

One pass multiplies x [rows, in] by the 120 matrices of the model's 30 layers (qkv [960, 576],
o [576, 576], gate_up [3072, 576], down [576, 1536]: 106 M weights, more than the last-level
cache, so every pass streams them from DRAM, as a decode step does). Each cell is the median
of `--repeats` passes in ms, after one warm-up pass. The paths:

- `bf16`: the unquantised layer (`linear.Linear`, bfloat16), torch's native GEMV under 3 rows
  (oneDNN off, `model.torch_gemv_backend`, as the model runs without the extension), oneDNN
  above;
- `int8 kernel`: `torch.ops.aten._weight_int8pack_mm` (bfloat16 x and scales);
- `int8 deq+mm`: codes → bfloat16 per call, oneDNN matmul, then the scales;
- `int4 kernel`: `torch.ops.aten._weight_int4pack_mm_for_cpu` (`quant.linear.PackedInt4Linear`);
- `int4 deq+mm`: the dequantise-per-call layout used off the CPU (`quant.linear.Int4Linear`);
- `int8 engine`, `int4 engine`: the layers the engine builds with the C++ extension (AVX2 or
  better: `quant.linear.ExtensionQuantLinear`): its int8/int4 matmul up to 16 rows, its
  weight-only `quant_gemm` above (W dequantised a block at a time, met on the AMX tiles or, on
  a CPU with AVX-512 BF16 and no AMX, on vectors; on AVX2 into float32 panels, met on FMAs).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from llmbench.engine.kernel_ops import cpu_extension
from llmbench.engine.linear import Linear
from llmbench.engine.model import torch_gemv_backend
from llmbench.engine.quant.linear import (
    int4_layer,
    int8_layer,
    packed_int4_layer,
    quantize_linear,
)
from llmbench.engine.quant.scheme import parse_quantize

SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536)]
NUM_LAYERS = 30


def _paths(weights: list[torch.Tensor]) -> dict[str, list[Callable]]:
    """Per path, one callable per matrix: x [rows, in] → y [rows, out]."""
    bf16 = torch.bfloat16
    dense = [Linear.build(w.to(bf16)) for w in weights]
    int8 = [int8_layer(w, None, bf16) for w in weights]
    int4 = [packed_int4_layer(w, None, parse_quantize("int4:32")) for w in weights]
    int4_torch = [int4_layer(w.to(bf16), None, parse_quantize("int4:32")) for w in weights]
    extension = cpu_extension()
    engine = {}
    if extension.has_quant_gemv:
        for name in ("int8", "int4"):
            scheme = parse_quantize(name)
            engine[f"{name} engine"] = [
                quantize_linear(w.to(bf16), None, scheme, extension) for w in weights
            ]
    return {
        "bf16": dense,
        "int8 kernel": [
            lambda x, q=q: torch.ops.aten._weight_int8pack_mm(x, q.codes, q.scale) for q in int8
        ],
        "int8 deq+mm": [
            lambda x, q=q: torch.mm(x, q.codes.to(bf16).t()).mul_(q.scale) for q in int8
        ],
        "int4 kernel": int4,
        "int4 deq+mm": int4_torch,
        **engine,
    }


def time_pass(layers: list[Callable], xs: dict[int, torch.Tensor], repeats: int) -> float:
    """Median seconds of one pass over every matrix (layers[i] has SHAPES[i % 4]'s shape)."""
    num_rows = next(iter(xs.values())).shape[0]

    def one_pass() -> None:
        with torch_gemv_backend(num_rows):
            for layer, (_, num_in) in zip(layers, SHAPES * NUM_LAYERS, strict=False):
                layer(xs[num_in])

    one_pass()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        one_pass()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 128, 512])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(0)
    weights = [
        torch.randn(*shape, generator=g) * 0.02 for _ in range(NUM_LAYERS) for shape in SHAPES
    ]
    paths = _paths(weights)
    print(f"{'rows':<12}" + "".join(f"{n:>8}" for n in args.rows) + "   (ms per pass)")
    for name, layers in paths.items():
        cells = []
        for num_rows in args.rows:
            if name == "int4 deq+mm" and num_rows < 32:  # far slower: not a decode candidate
                cells.append(f"{'-':>8}")
                continue
            xs = {k: torch.randn(num_rows, k, generator=g).bfloat16() for k in (576, 1536)}
            cells.append(f"{time_pass(layers, xs, args.repeats) * 1e3:8.1f}")
        print(f"{name:<12}" + "".join(cells), flush=True)


if __name__ == "__main__":
    main()
