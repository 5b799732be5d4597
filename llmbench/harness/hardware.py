"""Hardware ceilings: the roofs a run is placed under, measured here or read from a datasheet.

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


# Datasheet peaks, dense (no 2:4 sparsity). `float32` is the non-tensor-core (vector) rate;
# `bfloat16`/`float16` the dense tensor-core rate; `int8` dense tensor-core ops/s. Bandwidth and
# memory in decimal units as marketed (GB = 1e9). None where we are not sure of the number.
_TB = 1e12
_T = 1e12
_GB = 1e9

HARDWARE: dict[str, dict] = {
    # NVIDIA A100 datasheet (SXM4): 1,555 GB/s HBM2; FP32 19.5 TF, BF16/FP16 312 TF, INT8 624 TOPS.
    "A100-40GB": {
        "memory_bandwidth_bytes_per_s": 1.555 * _TB,
        "flops_per_s": {
            "float32": 19.5 * _T,
            "bfloat16": 312 * _T,
            "float16": 312 * _T,
            "int8": 624 * _T,
        },
        "memory_bytes": 40 * _GB,
        "interconnect": "NVLink 3, 600 GB/s",
    },
    # NVIDIA A100 datasheet (80GB SXM4): 2,039 GB/s HBM2e; same compute as the 40GB.
    "A100-80GB": {
        "memory_bandwidth_bytes_per_s": 2.039 * _TB,
        "flops_per_s": {
            "float32": 19.5 * _T,
            "bfloat16": 312 * _T,
            "float16": 312 * _T,
            "int8": 624 * _T,
        },
        "memory_bytes": 80 * _GB,
        "interconnect": "NVLink 3, 600 GB/s",
    },
    # NVIDIA H100 datasheet (SXM5): 3.35 TB/s; FP32 67 TF, BF16/FP16 989 TF, INT8 1,979 TOPS.
    "H100-SXM": {
        "memory_bandwidth_bytes_per_s": 3.35 * _TB,
        "flops_per_s": {
            "float32": 67 * _T,
            "bfloat16": 989 * _T,
            "float16": 989 * _T,
            "int8": 1979 * _T,
        },
        "memory_bytes": 80 * _GB,
        "interconnect": "NVLink 4, 900 GB/s",
    },
    # NVIDIA H100 datasheet (PCIe): 2.0 TB/s; FP32 51 TF, BF16/FP16 756 TF, INT8 1,513 TOPS.
    "H100-PCIe": {
        "memory_bandwidth_bytes_per_s": 2.0 * _TB,
        "flops_per_s": {
            "float32": 51 * _T,
            "bfloat16": 756 * _T,
            "float16": 756 * _T,
            "int8": 1513 * _T,
        },
        "memory_bytes": 80 * _GB,
        "interconnect": "PCIe Gen5, 128 GB/s (NVLink bridge 600 GB/s)",
    },
    # NVIDIA H200 datasheet (SXM): 4.8 TB/s HBM3e, 141 GB; compute as H100 SXM.
    "H200": {
        "memory_bandwidth_bytes_per_s": 4.8 * _TB,
        "flops_per_s": {
            "float32": 67 * _T,
            "bfloat16": 989 * _T,
            "float16": 989 * _T,
            "int8": 1979 * _T,
        },
        "memory_bytes": 141 * _GB,
        "interconnect": "NVLink 4, 900 GB/s",
    },
    # NVIDIA HGX B200 datasheet, per GPU: 8 TB/s HBM3e; BF16/FP16 2.25 PF, INT8 4.5 POPS dense.
    # FP32 vector rate not stated there; 192 GB per the product brief (180 GB usable in DGX B200).
    "B200": {
        "memory_bandwidth_bytes_per_s": 8.0 * _TB,
        "flops_per_s": {
            "float32": None,
            "bfloat16": 2250 * _T,
            "float16": 2250 * _T,
            "int8": 4500 * _T,
        },
        "memory_bytes": 192 * _GB,
        "interconnect": "NVLink 5, 1.8 TB/s",
    },
    # NVIDIA L4 datasheet: 300 GB/s GDDR6, 24 GB; FP32 30.3 TF, BF16/FP16 121 TF, INT8 242.5 TOPS.
    "L4": {
        "memory_bandwidth_bytes_per_s": 0.3 * _TB,
        "flops_per_s": {
            "float32": 30.3 * _T,
            "bfloat16": 121 * _T,
            "float16": 121 * _T,
            "int8": 242.5 * _T,
        },
        "memory_bytes": 24 * _GB,
        "interconnect": "PCIe Gen4 x16, 64 GB/s",
    },
    # NVIDIA L40S datasheet: 864 GB/s GDDR6, 48 GB; FP32 91.6 TF, BF16/FP16 362 TF, INT8 733 TOPS.
    "L40S": {
        "memory_bandwidth_bytes_per_s": 0.864 * _TB,
        "flops_per_s": {
            "float32": 91.6 * _T,
            "bfloat16": 362.05 * _T,
            "float16": 362.05 * _T,
            "int8": 733 * _T,
        },
        "memory_bytes": 48 * _GB,
        "interconnect": "PCIe Gen4 x16, 64 GB/s",
    },
    # NVIDIA Ada whitepaper (RTX 4090): 1,008 GB/s GDDR6X, 24 GB; FP32 82.6 TF; BF16/FP16 tensor
    # with FP32 accumulate 165.2 TF (what frameworks use; 330 with FP16 accumulate); INT8 660.6.
    "RTX-4090": {
        "memory_bandwidth_bytes_per_s": 1.008 * _TB,
        "flops_per_s": {
            "float32": 82.6 * _T,
            "bfloat16": 165.2 * _T,
            "float16": 165.2 * _T,
            "int8": 660.6 * _T,
        },
        "memory_bytes": 24 * _GB,
        "interconnect": "PCIe Gen4 x16, 64 GB/s (no NVLink)",
    },
    # AMD Instinct MI300X datasheet: 5.3 TB/s HBM3, 192 GB; FP32 vector 81.7 TF, BF16/FP16
    # 1,307.4 TF, INT8 2,614.9 TOPS dense.
    "MI300X": {
        "memory_bandwidth_bytes_per_s": 5.3 * _TB,
        "flops_per_s": {
            "float32": 81.7 * _T,
            "bfloat16": 1307.4 * _T,
            "float16": 1307.4 * _T,
            "int8": 2614.9 * _T,
        },
        "memory_bytes": 192 * _GB,
        "interconnect": "Infinity Fabric, 896 GB/s",
    },
}


_ALIASES = {"h100": "h100-sxm", "a100": "a100-80gb", "4090": "rtx-4090"}


def datasheet(name: str) -> dict[str, Any] | None:
    """The `HARDWARE` entry for a name in any case, or a short alias (h100, a100, 4090)."""
    by_lower = {key.lower(): value for key, value in HARDWARE.items()}
    return by_lower.get(_ALIASES.get(name.lower(), name.lower()))


# What `torch.cuda.get_device_name()` says → HARDWARE key; the first match wins, so the
# more specific patterns come first. All words of a pattern must be in the name.
_DEVICE_NAMES = (
    ("h100 pcie", "H100-PCIe"),
    ("h100", "H100-SXM"),
    ("h200", "H200"),
    ("b200", "B200"),
    ("a100 40gb", "A100-40GB"),
    ("a100", "A100-80GB"),
    ("l40s", "L40S"),
    ("l4", "L4"),
    ("4090", "RTX-4090"),
    ("mi300x", "MI300X"),
)


def datasheet_name_of(device_name: str) -> str | None:
    """The datasheet entry of a device as the driver names it ("NVIDIA H100 80GB HBM3" →
    "H100-SXM"), or None (CPUs, unknown GPUs)."""
    words = device_name.lower().replace("-", " ").split()
    for pattern, key in _DEVICE_NAMES:
        if all(part in words for part in pattern.split()):
            return key
    return None

