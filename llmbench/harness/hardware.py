"""Measured hardware ceilings: the roofs a run is placed under.

Datasheet peaks are marketing maxima; a roofline built on them makes every run look bad. So the
roofs are *measured* on the device the engine uses, with the engine's threads: memory bandwidth
(a large copy, bytes read + written; and a read-only reduction) and matmul FLOP/s per dtype
(float32, bfloat16, float16, and int8 → int32 where torch has it for the device), each
the median of several timed repetitions after a warm-up. Results are cached per device, thread
count and torch version; `llmbench hardware --refresh` measures again.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

_REPEATS = 5


def _cache_path(key: str) -> Path:
    base = Path(os.environ.get("LLMBENCH_CACHE") or Path.home() / ".cache" / "llmbench")
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in key)
    return base / "hardware" / f"{safe}.json"


def _timed(fn, sync) -> float:
    """Median seconds of fn() over _REPEATS runs, after one warm-up run."""
    fn()
    sync()
    times = []
    for _ in range(_REPEATS):
        t0 = time.perf_counter_ns()
        fn()
        sync()
        times.append((time.perf_counter_ns() - t0) / 1e9)
    return statistics.median(times)


def measure(device_name: str = "cpu") -> dict[str, Any]:
    """Measure the roofs of `device_name` ("cpu" or "cuda") with torch's current threads."""
    import torch

    device = torch.device(device_name)
    is_gpu = device.type == "cuda"
    sync = torch.cuda.synchronize if is_gpu else (lambda: None)
    # Buffers far larger than any cache: 256 MiB on CPU (L3 is tens of MiB), 1 GiB on a GPU.
    num_bytes = (1 << 30) if is_gpu else (1 << 28)
    src = torch.ones(num_bytes // 4, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    copy_s = _timed(lambda: dst.copy_(src), sync)
    read_s = _timed(lambda: src.sum(), sync)
    matmul = {}
    n = 8192 if is_gpu else 2048
    for name in ("float32", "bfloat16", "float16"):
        dtype = getattr(torch, name)
        a = torch.randn(n, n, device=device).to(dtype)
        b = torch.randn(n, n, device=device).to(dtype)
        seconds = _timed(lambda a=a, b=b: torch.mm(a, b), sync)
        matmul[name] = 2 * n**3 / seconds  # n^2 outputs, n multiply-adds each
    # int8 x int8 -> int32 (what W8A8 kernels run), where this torch build and device have it.
    a = torch.randint(-128, 128, (n, n), dtype=torch.int8, device=device)
    b = torch.randint(-128, 128, (n, n), dtype=torch.int8, device=device)
    try:
        matmul["int8"] = 2 * n**3 / _timed(lambda: torch._int_mm(a, b), sync)
    except (RuntimeError, AttributeError):  # no int8 matmul here: leave the dtype out
        pass
    return {
        "device": torch.cuda.get_device_name(device) if is_gpu else _cpu_name(),
        "device_type": device.type,
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "copy_bytes_per_s": 2 * num_bytes / copy_s,  # read + write
        "read_bytes_per_s": num_bytes / read_s,
        "matmul_flops_per_s": matmul,
        "method": f"median of {_REPEATS} after a warm-up; {num_bytes >> 20} MiB buffers; "
        f"{n}x{n} matmuls",
    }


def _cpu_name() -> str:
    from llmbench.harness.results import cpu_name

    return cpu_name()


def ceilings(device_name: str = "cpu", refresh: bool = False) -> dict[str, Any]:
    """The cached measurement for this device, thread count and torch; measured if missing."""
    import torch

    key = f"{device_name}-{torch.get_num_threads()}threads-torch{torch.__version__}"
    if device_name == "cuda":
        key = f"{torch.cuda.get_device_name()}-{key}"
    path = _cache_path(key)
    if path.is_file() and not refresh:
        try:
            return json.loads(path.read_text())
        except json.JSONDecodeError:
            pass  # a damaged cache entry: measure again
    result = measure(device_name)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=2))
    tmp.replace(path)
    return result
