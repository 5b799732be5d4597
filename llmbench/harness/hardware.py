"""Hardware ceilings: the roofs a run is placed under, measured here or read from a datasheet.

Datasheet peaks are marketing maxima; a roofline built on them makes every run look bad. So the
roofs are *measured* on the device the engine uses, with the engine's threads: memory bandwidth
(a copy, bytes read + written, and a read-only reduction, over buffers far larger than any
cache: 256 MiB on a CPU, whose L3 is tens of MiB; 1 GiB on a GPU) and matmul FLOP/s per dtype
(float32, bfloat16, float16, and int8 → int32 where torch has it for the device).

Every probe is sized by time, inside one budget for all of them (`DEFAULT_BUDGET_S`): a matmul
starts at 256² (1024² on a GPU) and doubles up to 2048² (8192²) while one run stays under
`MAX_RUN_S`, so a dtype with no fast path (float16 on most CPUs runs at 0.3-2 GFLOP/s: one 2048²
run takes 10-60 s) is measured smaller, and a note says so. Then up to `REPEATS` runs are timed
within the probe's cap (`PROBE_CAP_S`) and what is left of the budget, and the best run is the
roof (as STREAM reports the best of N): a roof is what the hardware reaches, and medians of a
few short runs moved by a fifth between two processes here. A small matmul shows a slow path at
its best, which errs on the high side, as a roof should. Bandwidth is always measured
(`BANDWIDTH_ALLOCATIONS` fresh buffers × `BANDWIDTH_REPEATS` runs, about a second). Even so, on
the 2-core VMs this project is developed on, one process measures 40-50 GB/s read and the next
67-75 (huge pages or not, it seems), while the engine's speed does not follow: compare MBU
between runs there with that in mind (the results keep every probe). A dtype the
budget has no time left for is skipped with a note and measured by a later call. Results are
cached per device, thread count and torch version, each probe with its date; `ceilings`
measures only what the cache lacks, and says where each number came from; `llmbench hardware
--refresh` measures everything again.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

DEFAULT_BUDGET_S = 60.0  # all the probes of one measurement
PROBE_CAP_S = 10.0  # one probe at most
MAX_RUN_S = 0.75  # a matmul stops growing before one run would take longer than this
REPEATS = 5  # timed runs per matmul probe (the best is kept), as the cap allows
BANDWIDTH_REPEATS = 10  # timed runs per bandwidth probe and buffer (~10 ms each on a CPU)
BANDWIDTH_ALLOCATIONS = 6  # fresh buffers per bandwidth measurement
MATMUL_DTYPES = ("float32", "bfloat16", "float16", "int8")
# A dtype measured small and this many times slower than the fastest dtype measured before it
# in the same call is said to have no fast path on the device.
_SLOW_FACTOR = 10

Progress = Callable[[str], None]


def _cache_path(key: str) -> Path:
    base = Path(os.environ.get("LLMBENCH_CACHE") or Path.home() / ".cache" / "llmbench")
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in key)
    return base / "hardware" / f"{safe}.json"


def _timed_once(fn: Callable[[], object], sync: Callable[[], None]) -> float:
    t0 = time.perf_counter_ns()
    fn()
    sync()
    return (time.perf_counter_ns() - t0) / 1e9


def _repeat(
    fn: Callable[[], object],
    sync: Callable[[], None],
    times: list[float],
    start: float,
    cap_s: float,
    repeats: int = REPEATS,
) -> list[float]:
    """`times` (runs already timed) and more, up to `repeats` in all, while the next run still
    fits in `cap_s` seconds since `start` (perf_counter)."""
    times = list(times)
    while len(times) < repeats and time.perf_counter() - start + times[-1] <= cap_s:
        times.append(_timed_once(fn, sync))
    return times


def size_by_time(
    make: Callable[[int], Callable[[], object]],
    sync: Callable[[], None],
    n_min: int,
    n_max: int,
    cap_s: float,
) -> tuple[int, list[float]]:
    """An n×n matmul probe sized by time: (n, seconds of each timed run at that n).

    From `n_min`, each size runs once as a warm-up and twice timed; it doubles while the doubled
    size is at most `n_max`, one run of it would take at most MAX_RUN_S (8× the faster run:
    n³ work) and its three runs fit in `cap_s`. A dtype with a fast path reaches `n_max`; one
    without stops where a run gets slow. Then `_repeat` times it up to REPEATS times in `cap_s`.
    """
    start = time.perf_counter()
    n = n_min
    while True:
        fn = make(n)
        fn()  # warm-up: first-call costs (page faults, kernel selection) stay out of the time
        sync()
        times = [_timed_once(fn, sync), _timed_once(fn, sync)]
        next_s = 8 * min(times)
        spent = time.perf_counter() - start
        if 2 * n > n_max or next_s > MAX_RUN_S or spent + 3 * next_s > cap_s:
            break
        n *= 2
    return n, _repeat(fn, sync, times, start, cap_s)


def _matmul(dtype: str, n: int, device: Any) -> Callable[[], object]:
    """One n×n by n×n matmul of `dtype`, ready to run (int8 multiplies into int32)."""
    import torch

    if dtype == "int8":
        a = torch.randint(-128, 128, (n, n), dtype=torch.int8, device=device)
        b = torch.randint(-128, 128, (n, n), dtype=torch.int8, device=device)
        return lambda: torch._int_mm(a, b)
    a = torch.randn(n, n, device=device).to(getattr(torch, dtype))
    b = torch.randn(n, n, device=device).to(getattr(torch, dtype))
    return lambda: torch.mm(a, b)


# dtype → (dtype, n, device) → a matmul to time. A table so a test can put a slow one in.
MATMULS: dict[str, Callable[[str, int, Any], Callable[[], object]]] = {
    dtype: _matmul for dtype in MATMUL_DTYPES
}


def _probe(size: int, times: list[float], note: str | None = None) -> dict[str, Any]:
    return {
        "size": size,
        "repeats": len(times),
        "seconds": min(times),
        "measured_unix_s": time.time(),
        "note": note,
    }


def measure(
    device_name: str = "cpu",
    budget_s: float = DEFAULT_BUDGET_S,
    dtypes: Iterable[str] = MATMUL_DTYPES,
    with_bandwidth: bool = True,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Measure the roofs of `device_name` ("cpu" or "cuda") with torch's current threads:
    bandwidth (unless `with_bandwidth` is False) and the matmuls of `dtypes`, in that order,
    within `budget_s` seconds (one probe may end past it by up to one of its runs).

    Returns the fields of `results.HardwareCeilings` but `sources`, plus `skipped` (dtypes
    the budget left out) and `unsupported` (dtypes torch has no matmul for here).
    """
    import torch

    from llmbench.harness.provenance import cpu_name

    deadline = time.perf_counter() + budget_s
    device = torch.device(device_name)
    is_gpu = device.type == "cuda"
    sync = torch.cuda.synchronize if is_gpu else (lambda: None)
    say = progress or (lambda message: None)
    n_min, n_max = (1024, 8192) if is_gpu else (256, 2048)
    num_bytes = (1 << 30) if is_gpu else (1 << 28)
    out: dict[str, Any] = {
        "device": torch.cuda.get_device_name(device) if is_gpu else cpu_name(),
        "device_type": device.type,
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "matmul_flops_per_s": {},
        "method": f"best of up to {BANDWIDTH_ALLOCATIONS}x{BANDWIDTH_REPEATS} (bandwidth, fresh "
        f"buffers) or {REPEATS} (matmul) runs "
        f"after a warm-up; {num_bytes >> 20} MiB "
        f"buffers; each matmul doubled from {n_min}x{n_min} to {n_max}x{n_max} while a run "
        f"stays under {MAX_RUN_S:g} s; {budget_s:g} s budget",
        "notes": [],
        "probes": {},
        "skipped": [],
        "unsupported": [],
    }
    if with_bandwidth:
        say("memory bandwidth")
        times = {"copy": [], "read": []}
        # Fresh buffers each round: one allocation may land on huge pages and another not, and
        # the same code measured 42 or 72 GB/s read here depending on which it got.
        for _ in range(BANDWIDTH_ALLOCATIONS):
            src = torch.ones(num_bytes // 4, dtype=torch.float32, device=device)
            dst = torch.empty_like(src)
            probes = (("copy", lambda: dst.copy_(src)), ("read", lambda: src.sum()))  # noqa: B023
            for name, fn in probes:
                start = time.perf_counter()
                fn()
                sync()
                cap_s = min(PROBE_CAP_S, max(0.0, deadline - time.perf_counter()))
                first = [_timed_once(fn, sync)]
                times[name] += _repeat(fn, sync, first, start, cap_s, BANDWIDTH_REPEATS)
            del src, dst
        for name, moved in (("copy", 2 * num_bytes), ("read", num_bytes)):  # copy: read + write
            out["probes"][name] = _probe(num_bytes, times[name])
            out[f"{name}_bytes_per_s"] = moved / min(times[name])
    for dtype in dtypes:
        left_s = deadline - time.perf_counter()
        if left_s <= 0:
            out["skipped"].append(dtype)
            continue
        say(f"matmul {dtype}")
        make = MATMULS[dtype]
        try:
            n, times = size_by_time(
                lambda n, d=dtype, m=make: m(d, n, device),
                sync,
                n_min,
                n_max,
                min(PROBE_CAP_S, left_s),
            )
        except (RuntimeError, AttributeError, NotImplementedError):
            out["unsupported"].append(dtype)
            continue
        rate = 2 * n**3 / min(times)  # n² outputs, n multiply-adds each
        note = None
        if n < n_max:
            note = (
                f"matmul {dtype}: measured at {n}x{n}, not {n_max}x{n_max} (a run took "
                f"{min(times) * 1e3:.0f} ms): {rate / 1e9:.2f} GFLOP/s"
            )
            rates = out["matmul_flops_per_s"]
            fastest = max(rates, key=rates.get, default=None)
            if fastest is not None and rate < rates[fastest] / _SLOW_FACTOR:
                note += f", {rates[fastest] / rate:.0f}x below {fastest}: no fast path for it here"
        out["matmul_flops_per_s"][dtype] = rate
        out["probes"][dtype] = _probe(n, times, note)
    out["notes"] = _notes(out)
    return out


def _notes(roofs: dict[str, Any]) -> list[str]:
    """What to tell about a measurement: dtypes measured small, skipped, or not available."""
    return [
        *(probe["note"] for probe in roofs["probes"].values() if probe.get("note")),
        *(
            f"matmul {dtype}: not measured, the time budget was spent (a later run measures it)"
            for dtype in roofs["skipped"]
        ),
        *(f"matmul {dtype}: torch has none on this device" for dtype in roofs["unsupported"]),
    ]


def ceilings(
    device_name: str = "cpu",
    refresh: bool = False,
    budget_s: float = DEFAULT_BUDGET_S,
    first: str | None = None,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """This device's roofs (the fields of `results.HardwareCeilings`): from the cache for this
    device, thread count and torch, measuring only what it lacks (everything with `refresh`),
    `first` dtype first, within `budget_s`. `sources` says where each probe's number came from.
    """
    import torch

    key = f"{device_name}-{torch.get_num_threads()}threads-torch{torch.__version__}"
    if device_name == "cuda":
        key = f"{torch.cuda.get_device_name()}-{key}"
    path = _cache_path(key)
    cached = None if refresh else _read_cache(path)
    order = sorted(MATMUL_DTYPES, key=lambda d: d != first)
    known = set() if cached is None else {*cached["matmul_flops_per_s"], *cached["unsupported"]}
    missing = [d for d in order if d not in known]
    if cached is not None and not missing:
        return _with_sources(cached, path, set())
    measured = measure(device_name, budget_s, missing, cached is None, progress)
    merged = measured if cached is None else _merge(cached, measured)
    merged["notes"] = _notes(merged)
    _write_cache(path, merged)
    return _with_sources(merged, path, set(measured["probes"]))


def _merge(cached: dict[str, Any], measured: dict[str, Any]) -> dict[str, Any]:
    merged = {**cached, "method": measured["method"], "skipped": measured["skipped"]}
    merged["matmul_flops_per_s"] = {
        **cached["matmul_flops_per_s"],
        **measured["matmul_flops_per_s"],
    }
    merged["probes"] = {**cached["probes"], **measured["probes"]}
    merged["unsupported"] = [*cached["unsupported"], *measured["unsupported"]]
    merged["notes"] = _notes(merged)
    return merged


def _read_cache(path: Path) -> dict[str, Any] | None:
    """The cache entry, or None when absent, damaged, or written by an llmbench that did not
    record its probes or kept medians, not the best runs (measured again: it takes seconds)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    if not isinstance(data, dict) or not isinstance(data.get("probes"), dict):
        return None
    if not str(data.get("method", "")).startswith("best of"):
        return None
    data.setdefault("unsupported", [])
    data["skipped"] = []  # what this call skips, not what an earlier one did
    data["notes"] = _notes(data)
    return data


def _write_cache(path: Path, roofs: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({k: v for k, v in roofs.items() if k != "skipped"}, indent=2))
    tmp.replace(path)


def _with_sources(roofs: dict[str, Any], path: Path, measured_now: set[str]) -> dict[str, Any]:
    """`roofs` without the bookkeeping keys, with `sources`: probe → "measured now" or
    "cache <file> (measured <date>)"."""
    out = {k: v for k, v in roofs.items() if k not in ("skipped", "unsupported")}
    out["sources"] = {
        name: "measured now"
        if name in measured_now
        else f"cache {path} (measured {_date(probe['measured_unix_s'])})"
        for name, probe in roofs["probes"].items()
    }
    return out


def _date(unix_s: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(unix_s))


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
