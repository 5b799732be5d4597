"""The CPU 16-bit matmul paths at SmolLM2-135M's shapes, in GB/s of weights streamed from DRAM.

    python benchmarks/cpu_gemv.py [--rows 1 2 4] [--dtype bfloat16] [--repeats 7]
    python benchmarks/cpu_gemv.py --decode [--tokens 256] [--repeats 3]

For each fused matrix of the model (qkv [960, 576], o [576, 576], gate_up [3072, 576],
down [576, 1536], lm_head [49152, 576]) it keeps enough copies to fill 256 MB, far more than the
last-level cache, and multiplies x [rows, K] by the copies in turn, so every call reads its
weight from memory as a decode step does. Each cell is the median over `--repeats` passes of
(weight bytes / time per call). The paths:

- `ext`: the C++ extension's matmul (`llmbench.kernels.cpu_gemv`);
- `native`: torch.mm with oneDNN off (what the model runs under 3 rows without the extension);
- `onednn`: torch.mm through oneDNN;
- `read`: a plain read of the same bytes (`sum` over them viewed as float32): the roof.

`--decode`: single-stream smollm2-135m decode through the engine, bfloat16 with the extension,
bfloat16 on torch's ops (LLMBENCH_CPU_EXTENSION=torch) and float32, taking turns in one process
with a 512 MB read-bandwidth probe in every round; prints per engine the median tok/s, achieved
GB/s (the cost model's bytes per decode step / step time) and MBU against the same round's read
bandwidth (median over rounds).
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings
from collections.abc import Callable

import torch

from llmbench.kernels import cpu_extension, cpu_gemv

warnings.filterwarnings("ignore", message="TF32 acceleration on top of oneDNN")

SHAPES = {
    "qkv": (960, 576),
    "o": (576, 576),
    "gate_up": (3072, 576),
    "down": (576, 1536),
    "lm_head": (49152, 576),
}
POOL_BYTES = 256 * 1024 * 1024


def _rates(
    paths: dict[str, Callable[[torch.Tensor], object]], weights: list[torch.Tensor], repeats: int
) -> dict[str, tuple[float, float]]:
    """(median, best) GB/s per path; the paths take turns within each repeat, so load from
    other processes hits them alike."""
    num_bytes = sum(w.numel() * w.element_size() for w in weights)
    rates: dict[str, list[float]] = {name: [] for name in paths}
    for repeat in range(repeats + 1):
        for name, call in paths.items():
            t0 = time.perf_counter()
            for w in weights:
                call(w)
            if repeat:  # the first round is a warm-up
                rates[name].append(num_bytes / (time.perf_counter() - t0) / 1e9)
    return {name: (statistics.median(r), max(r)) for name, r in rates.items()}


def _read_gb_per_s() -> float:
    """Best of 3 full reads of a 512 MB float32 buffer (`sum`), in GB/s."""
    buffer = torch.ones(128 * 1024 * 1024)
    best = 0.0
    for _ in range(3):
        t0 = time.perf_counter()
        buffer.sum()
        best = max(best, buffer.numel() * 4 / (time.perf_counter() - t0) / 1e9)
    return best


def decode(tokens: int, repeats: int) -> None:
    from llmbench.engine.engine import EngineConfig, LLMEngine
    from llmbench.engine.sampling import SamplingParams
    from llmbench.harness.generate_stats import decode_bytes_per_s, decode_tok_per_s

    torch_matmul = cpu_extension.CpuExtension("torch", "LLMBENCH_CPU_EXTENSION=torch")
    engines = {}
    for name, dtype in (("bf16 ext", "bfloat16"), ("bf16 torch", "bfloat16"), ("f32", "float32")):
        if name == "bf16 torch":
            saved, cpu_extension.default = cpu_extension.default, lambda: torch_matmul
        engines[name] = LLMEngine(EngineConfig(dtype=dtype, device="cpu", max_num_seqs=1))
        if name == "bf16 torch":
            cpu_extension.default = saved
    prompt = [{"role": "user", "content": "Write a long story about a lighthouse keeper."}]
    params = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)
    results: dict[str, list[tuple[float, float, float]]] = {name: [] for name in engines}
    for repeat in range(repeats + 1):  # the first round is a warm-up
        read = _read_gb_per_s()
        for name, engine in engines.items():
            ids = engine.tokenizer.encode_chat(prompt)
            engine.step_records.clear()
            token_ns = [out.t_ns for out in engine.stream(ids, params)]
            rate = decode_tok_per_s(token_ns)
            achieved = decode_bytes_per_s(
                engine.model_config,
                engine.step_records,
                engine.dtype.itemsize,
                weight_bytes=engine.model.weight_bytes,
            )
            if repeat:
                results[name].append((rate, achieved / 1e9, achieved / 1e9 / read))
        print(f"round {repeat}: read {read:.1f} GB/s", flush=True)
    for name, rows in results.items():
        rate, achieved, mbu = (statistics.median(r[i] for r in rows) for i in range(3))
        print(f"{name:>10}: {rate:6.1f} tok/s, {achieved:5.1f} GB/s achieved, MBU {mbu:4.2f}")
    print(engines["bf16 ext"].model.kernels_description)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--decode", action="store_true", help="time whole decode steps")
    parser.add_argument("--tokens", type=int, default=256)
    args = parser.parse_args()
    if args.decode:
        decode(args.tokens, args.repeats)
        return
    dtype = getattr(torch, args.dtype)
    backend = cpu_extension.default()
    print(f"threads {torch.get_num_threads()}, {backend.describe()}")
    op = backend.op(cpu_gemv.OP)
    names = ("ext", "native", "onednn", "read")
    print(f"{'shape':>8} {'rows':>4} " + " ".join(f"{n:>13}" for n in names) + "  GB/s median/best")
    for name, (n, k) in SHAPES.items():
        copies = max(2, POOL_BYTES // (n * k * 2))
        weights = [torch.randn(n, k).to(dtype) for _ in range(copies)]
        for rows in args.rows:
            x = torch.randn(rows, k).to(dtype)

            def native(w, x=x):
                with torch.backends.mkldnn.flags(enabled=False):
                    return torch.mm(x, w.t())

            paths = {
                "ext": lambda w, x=x: op(x, w, None, None),
                "native": native,
                "onednn": lambda w, x=x: torch.mm(x, w.t()),
                "read": lambda w: w.view(torch.float32).sum(),
            }
            rates = _rates(paths, weights, args.repeats)
            cells = " ".join(f"{rates[p][0]:6.1f}/{rates[p][1]:6.1f}" for p in names)
            print(f"{name:>8} {rows:>4} {cells}")
        del weights


if __name__ == "__main__":
    main()
