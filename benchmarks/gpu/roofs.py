"""Step `roofs`: this device's measured ceilings beside its datasheet row.

The ceilings are what `llmbench hardware --device cuda --refresh` measures
(`roofline.ceilings.ceilings`, refreshed, its load watched; on the GPU with the command's own
60 s budget, in the dry run with a few seconds): HBM read and copy bandwidth, matmul FLOP/s in
float32, bfloat16, float16 and int8. They are cached where the engine step and the run read them
back. llmbench has no fp8 probe, so this step times one itself, the same way (`fp8_matmul`).

    python -m benchmarks.gpu.roofs --work DIR --device cuda --budget-s 60 --fp8-n 8192
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from benchmarks.gpu.part_records import PartWriter

NUM_FP8_RUNS = 10


def fp8_matmul(n: int, device: str) -> dict:
    """Best and median FLOP/s of an n×n by n×n float8 (e4m3) matmul into bfloat16, scaled by
    one (`torch._scaled_mm`: the second operand column-major, as cuBLASLt wants it).

    Formula: FLOP/s = 2·n³ / seconds of one run; best of `NUM_FP8_RUNS` after a warm-up.
    """
    import torch

    fp8 = torch.float8_e4m3fn
    a = torch.randn(n, n, device=device).to(fp8)
    b = torch.randn(n, n, device=device).to(fp8).t()  # column-major [n, n]
    one = torch.ones((), device=device)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)

    def run() -> float:
        sync()
        t0 = time.perf_counter()
        torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
        sync()
        return time.perf_counter() - t0

    run()  # warm-up: the library picks its kernel
    seconds = [run() for _ in range(NUM_FP8_RUNS)]
    flops = 2 * n**3
    return {
        "n": n,
        "best_per_s": flops / min(seconds),
        "median_per_s": flops / statistics.median(seconds),
        "runs": len(seconds),
        "method": f"torch._scaled_mm e4m3 x e4m3 -> bfloat16, {n}x{n}, best of {len(seconds)}",
    }


def datasheet_row(device_name: str) -> dict | None:
    """The datasheet entry of the device as its driver names it, with the entry's name."""
    from llmbench.roofline.datasheets import HARDWARE, datasheet_name_of

    name = datasheet_name_of(device_name)
    return None if name is None else {"name": name, **HARDWARE[name]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--budget-s", type=float, default=60.0)
    parser.add_argument("--fp8-n", type=int, default=8192)
    args = parser.parse_args()
    from llmbench.cli.roofline import hardware_table
    from llmbench.harness.provenance import LoadMonitor
    from llmbench.roofline import ceilings

    writer = PartWriter(args.work / "roofs.jsonl")
    roofs = ceilings.ceilings(
        args.device,
        refresh=True,
        budget_s=args.budget_s,
        progress=lambda probe: print(f"roofs: {probe}", flush=True),
        watch_load=LoadMonitor,
    )
    print(hardware_table(roofs))
    writer.row("ceilings", roofs)
    writer.row("datasheet", {"row": datasheet_row(roofs["device"])})
    try:
        fp8 = fp8_matmul(args.fp8_n, args.device)
    except Exception as error:  # no fp8 matmul on this device or torch: recorded
        writer.error("fp8", error)
        return
    print(fp8)
    writer.row("fp8", fp8)


if __name__ == "__main__":
    main()
