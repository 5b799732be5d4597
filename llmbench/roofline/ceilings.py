"""Hardware ceilings: the roofs a run is placed under, measured here or read from a datasheet.

Datasheet peaks are marketing maxima; a roofline built on them makes every run look bad. So the
roofs are *measured* on the device the engine uses, with the engine's threads, and each one
several ways, repeated until it stops moving, so that a user can tell a roof from noise.

Memory bandwidth: STREAM's kernels in torch — a read-only sum (bytes read), a copy (read +
write) and a triad a = b + s·c (two reads, one write), counted as STREAM counts them (no
write-allocate traffic) — each with all of the engine's threads and with one, over buffers at
least `LLC_MULTIPLE`× the last-level cache (`buffer_bytes`; 256 MiB at least, and when the cache
size is unknown; 1 GiB on a GPU), so no run is served from cache. The runs go in rounds, each on
freshly allocated buffers (one allocation may land on huge pages and the next not: the same code
measured 42 or 72 GB/s read here depending on which it got), until the best `AGREE_RUNS` runs of
every probe agree within `AGREE_TOLERANCE` (`has_converged`) or the bandwidth's share of the
budget ends. Every probe keeps its best and median rate and the spread of its runs
(`run_stats`). The roof MBU divides by is the best read-only sum at all threads (probe `read`;
`sources["read_bytes_per_s"]` says so): decode streams weights, it reads. The other probes show
whether that number is plausible: copy and triad near it, one thread below it.

Matmul FLOP/s per dtype (float32, bfloat16, float16, and int8 → int32 where torch has it): an
n×n matmul starts at 256² (1024² on a GPU) and doubles up to 2048² (8192²) while one run stays
under `MAX_RUN_S`, so a dtype with no fast path (float16 on most CPUs runs at 0.3-2 GFLOP/s: one
2048² run takes 10-60 s) is measured smaller, and a note says so; then it is repeated until its
best runs agree the same way, within the probe's cap (`PROBE_CAP_S`) and what is left of the
budget. A small matmul shows a slow path at its best, which errs on the high side, as a roof
should.

Every roof is a best run (as STREAM reports the best of N): a roof is what the hardware reaches.
A probe whose best runs never agreed says so in a note (a busy machine, or one whose bandwidth
moves: this project's 2-core VMs measured 7 to 19 GB/s read from one sitting to the next).
A dtype the budget has no time left for is skipped with a note and measured by a later call.
Results are cached per device, thread count and torch version, each probe with its date;
`ceilings` measures only what the cache lacks, and says where each number came from; `llmbench
hardware --refresh` measures everything again. A cache entry written before these probes
existed (no `format` `CACHE_FORMAT`) is measured again.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import statistics
import subprocess
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DEFAULT_BUDGET_S = 60.0  # all the probes of one measurement
BANDWIDTH_BUDGET_S = 20.0  # the bandwidth probes' share of it, at most (one round always runs)
PROBE_CAP_S = 10.0  # one matmul probe at most
MAX_RUN_S = 0.75  # a matmul stops growing before one run would take longer than this
MAX_REPEATS = 10  # timed runs per matmul probe at most
AGREE_RUNS = 3  # a probe has converged when its best this many runs ...
AGREE_TOLERANCE = 0.03  # ... are within this fraction of each other
BANDWIDTH_RUNS = 3  # timed runs per bandwidth probe in one round (one set of fresh buffers)
BANDWIDTH_MIN_ROUNDS = 2  # fresh allocations every bandwidth probe gets, time allowing
BANDWIDTH_MAX_ROUNDS = 8
LLC_MULTIPLE = 8  # bandwidth buffers are at least this many times the last-level cache
MIN_BUFFER_BYTES = 256 << 20  # and at least this (also when the cache size is unknown)
GPU_BUFFER_BYTES = 1 << 30
# The buffers of one round (three for the triad) take at most this share of available memory.
MAX_MEMORY_SHARE = 0.5
CACHE_FORMAT = 2  # cache entries of another format are measured again
MATMUL_DTYPES = ("float32", "bfloat16", "float16", "int8")
# A dtype measured small and this many times slower than the fastest dtype measured before it
# in the same call is said to have no fast path on the device.
_SLOW_FACTOR = 10

Progress = Callable[[str], None]


def _cache_path(key: str) -> Path:
    base = Path(os.environ.get("LLMBENCH_CACHE") or Path.home() / ".cache" / "llmbench")
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in key)
    return base / "hardware" / f"{safe}.json"


# --- the rules: when a probe has converged, what its runs say --------------------------------


def has_converged(
    seconds: Sequence[float], runs: int = AGREE_RUNS, tolerance: float = AGREE_TOLERANCE
) -> bool:
    """Whether a probe's best `runs` runs agree: its best is reproducible, not one lucky run.

    Formula: with t the run times sorted ascending, len(t) >= runs and
    t[runs - 1] <= (1 + tolerance) · t[0].
    """
    fastest = sorted(seconds)[:runs]
    return len(fastest) == runs and fastest[-1] <= (1 + tolerance) * fastest[0]


def run_stats(seconds: Sequence[float], work: float) -> dict[str, float]:
    """A probe's runs as rates: `work` (bytes moved or FLOPs) per run over each run's time.

    Formula: best_per_s = work / min(t); median_per_s = work / median(t);
    spread = 1 − min(t) / max(t) (the slowest run's shortfall against the best, 0 when all
    runs took the same time).
    """
    return {
        "best_per_s": work / min(seconds),
        "median_per_s": work / statistics.median(seconds),
        "spread": 1 - min(seconds) / max(seconds),
    }


def repeat_until_agreed(
    time_run: Callable[[], float],
    seconds: Sequence[float],
    is_out_of_time: Callable[[float], bool],
    max_runs: int = MAX_REPEATS,
) -> list[float]:
    """`seconds` (runs already timed, at least one) and more runs of `time_run` (one timed run
    → its seconds), until they have converged, `max_runs` are timed, or
    `is_out_of_time(seconds the next run should take)` says the next would not fit."""
    seconds = list(seconds)
    while (
        not has_converged(seconds) and len(seconds) < max_runs and not is_out_of_time(min(seconds))
    ):
        seconds.append(time_run())
    return seconds


def rounds_until_agreed(
    names: Sequence[str],
    time_round: Callable[[list[str]], dict[str, list[float]]],
    is_out_of_time: Callable[[], bool],
    min_rounds: int = BANDWIDTH_MIN_ROUNDS,
    max_rounds: int = BANDWIDTH_MAX_ROUNDS,
) -> dict[str, list[float]]:
    """Each named probe's run times over rounds: `time_round(pending)` times every pending probe
    a few runs (on fresh buffers) → name → seconds. Every probe runs in the first `min_rounds`
    rounds, later only the probes not yet converged; rounds stop when all have converged (after
    `min_rounds`), after `max_rounds`, or when `is_out_of_time()` after a round (the first round
    always runs whole)."""
    times: dict[str, list[float]] = {name: [] for name in names}
    for round_number in range(1, max_rounds + 1):
        pending = [
            name for name in names if round_number <= min_rounds or not has_converged(times[name])
        ]
        if not pending:
            break
        for name, seconds in time_round(pending).items():
            times[name] += seconds
        if is_out_of_time():
            break
    return times


def exceeds_ceiling_line(
    what: str, achieved_per_s: float, ceiling_per_s: float | None, unit: str, scale: float
) -> str | None:
    """A line for an achieved rate above its measured ceiling (None when it is not above, or
    there is no ceiling): then the ceiling, not the run, is wrong, and a utilisation above 1
    would only hide that. `unit` is printed after each rate divided by `scale` ("GB/s", 1e9)."""
    if not ceiling_per_s or achieved_per_s <= ceiling_per_s:
        return None
    return (
        f"{what} achieved {achieved_per_s / scale:.1f} {unit} > measured ceiling "
        f"{ceiling_per_s / scale:.1f} {unit}: the ceiling is stale or wrong; re-measure with "
        "`llmbench hardware --refresh`"
    )


# --- the machine: how big a buffer must be ---------------------------------------------------


def llc_bytes(cpu_root: Path = Path("/sys/devices/system/cpu")) -> int | None:
    """Bytes of last-level cache in the machine: every distinct instance of the highest cache
    level in sysfs (one per socket or core complex), summed; else `lscpu -B`'s figure for that
    level; None when neither says."""
    instances: dict[tuple[int, str], int] = {}  # (level, cpus sharing it) → bytes
    for index in cpu_root.glob("cpu[0-9]*/cache/index[0-9]*"):
        try:
            level = int((index / "level").read_text())
            kind = (index / "type").read_text().strip()
            shared = (index / "shared_cpu_list").read_text().strip()
            size = _size_bytes((index / "size").read_text().strip())
        except (OSError, ValueError):
            continue
        if kind in ("Unified", "Data") and size:
            instances[(level, shared)] = size
    if instances:
        top = max(level for level, _ in instances)
        return sum(size for (level, _), size in instances.items() if level == top)
    return _lscpu_llc_bytes()


def _size_bytes(text: str) -> int:
    """'32768K' → 33554432 (sysfs cache sizes)."""
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:].upper(), 1)
    return int(text.rstrip("KkMmGg")) * scale


def _lscpu_llc_bytes() -> int | None:
    try:
        text = subprocess.run(
            ["lscpu", "-B"], capture_output=True, text=True, timeout=5, check=True
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    levels = [(int(m[1]), int(m[2])) for m in re.finditer(r"^L(\d)\w* cache:\s+(\d+)", text, re.M)]
    return max(levels)[1] if levels else None


def mem_available_bytes() -> int | None:
    """MemAvailable from /proc/meminfo, in bytes (None where there is none)."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return None


def buffer_bytes(llc: int | None, available: int | None) -> tuple[int, str | None]:
    """The size of each bandwidth buffer, and a note when memory made it smaller than asked.

    Formula: max(LLC_MULTIPLE · llc, MIN_BUFFER_BYTES) (llc unknown: MIN_BUFFER_BYTES), at most
    MAX_MEMORY_SHARE · available / 3 (the triad's three buffers), in whole MiB.
    """
    wanted = max(LLC_MULTIPLE * (llc or 0), MIN_BUFFER_BYTES)
    if available is None or 3 * wanted <= MAX_MEMORY_SHARE * available:
        return wanted, None
    capped = int(MAX_MEMORY_SHARE * available / 3) >> 20 << 20
    return capped, (
        f"bandwidth buffers {capped >> 20} MiB, not {wanted >> 20} MiB ({LLC_MULTIPLE}x the "
        f"last-level cache): memory is short; part of each run may come from cache"
    )


# --- measuring -------------------------------------------------------------------------------


def _timed_once(fn: Callable[[], object], sync: Callable[[], None]) -> float:
    t0 = time.perf_counter_ns()
    fn()
    sync()
    return (time.perf_counter_ns() - t0) / 1e9


@dataclass(frozen=True)
class BandwidthKernel:
    """A STREAM kernel: `moved` bytes per run, in buffer sizes, as STREAM counts them."""

    name: str
    label: str
    num_buffers: int
    moved: int


BANDWIDTH_KERNELS = (
    BandwidthKernel("read", "read-only sum", 1, 1),
    BandwidthKernel("copy", "copy, read + write", 2, 2),
    BandwidthKernel("triad", "triad a = b + s*c, 2 reads + 1 write", 3, 3),
)


def _kernel_run(name: str, buffers: list[Any]) -> Callable[[], object]:
    import torch

    a, b, c = (buffers + [None, None])[:3]
    if name == "read":
        return lambda: a.sum()
    if name == "copy":
        return lambda: b.copy_(a)
    return lambda: torch.add(b, c, alpha=3.0, out=a)


def probe_name(kernel: str, threads: int, all_threads: int) -> str:
    """`read` at all threads, `read_1thread` at one (when all is more than one)."""
    return kernel if threads == all_threads else f"{kernel}_{threads}thread"


@contextlib.contextmanager
def _num_threads(threads: int) -> Iterator[None]:
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


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
    without stops where a run gets slow. Then `repeat_until_agreed` times it within `cap_s`.
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
    return n, repeat_until_agreed(
        lambda: _timed_once(fn, sync),
        times,
        lambda next_s: time.perf_counter() - start + next_s > cap_s,
    )


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


def _probe(
    size: int,
    seconds: list[float],
    work: float,
    unit: str,
    threads: int,
    method: str,
    note: str | None = None,
) -> dict[str, Any]:
    """One probe as cached and recorded (`results.Probe`)."""
    return {
        "size": size,
        "repeats": len(seconds),
        "seconds": min(seconds),
        "measured_unix_s": time.time(),
        "note": note,
        "method": method,
        "threads": threads,
        "unit": unit,
        **run_stats(seconds, work),
        "converged": has_converged(seconds),
    }


def _measure_bandwidth(
    out: dict[str, Any], device: Any, sync: Callable[[], None], deadline: float
) -> None:
    """The bandwidth probes into `out` (`probes`, `read_bytes_per_s`, `copy_bytes_per_s`)."""
    import torch

    is_gpu = device.type == "cuda"
    size, size_note = (
        (GPU_BUFFER_BYTES, None) if is_gpu else buffer_bytes(llc_bytes(), mem_available_bytes())
    )
    all_threads = out["threads"]
    thread_counts = [all_threads] if is_gpu or all_threads == 1 else [all_threads, 1]
    probes = {
        probe_name(kernel.name, threads, all_threads): (kernel, threads)
        for threads in thread_counts
        for kernel in BANDWIDTH_KERNELS
    }
    end = min(deadline, time.perf_counter() + BANDWIDTH_BUDGET_S)

    def time_round(pending: list[str]) -> dict[str, list[float]]:
        num_buffers = max(probes[name][0].num_buffers for name in pending)
        buffers = [
            torch.ones(size // 4, dtype=torch.float32, device=device) for _ in range(num_buffers)
        ]
        seconds = {}
        for name in pending:
            kernel, threads = probes[name]
            with _num_threads(threads):
                run = _kernel_run(kernel.name, buffers)
                run()  # warm-up: page faults and thread start-up stay out of the time
                sync()
                seconds[name] = [_timed_once(run, sync) for _ in range(BANDWIDTH_RUNS)]
        del buffers
        return seconds

    times = rounds_until_agreed(list(probes), time_round, lambda: time.perf_counter() >= end)
    for name, seconds in times.items():
        kernel, threads = probes[name]
        out["probes"][name] = _probe(
            size, seconds, kernel.moved * size, "B/s", threads, kernel.label
        )
    out["read_bytes_per_s"] = out["probes"]["read"]["best_per_s"]
    out["copy_bytes_per_s"] = out["probes"]["copy"]["best_per_s"]
    if size_note:
        out["probes"]["read"]["note"] = size_note
    out["method"] += (
        f"; bandwidth: {', '.join(k.label for k in BANDWIDTH_KERNELS)} at "
        f"{' and '.join(str(t) for t in thread_counts)} threads over {size >> 20} MiB buffers "
        f"(last-level cache {_mib(llc_bytes()) if not is_gpu else '-'}), "
        f"{BANDWIDTH_RUNS} runs per round on fresh buffers, {BANDWIDTH_MIN_ROUNDS} to "
        f"{BANDWIDTH_MAX_ROUNDS} rounds within {BANDWIDTH_BUDGET_S:g} s"
    )


def _mib(num_bytes: int | None) -> str:
    return "unknown" if num_bytes is None else f"{num_bytes >> 20} MiB"


def measure(
    device_name: str = "cpu",
    budget_s: float = DEFAULT_BUDGET_S,
    dtypes: Iterable[str] = MATMUL_DTYPES,
    with_bandwidth: bool = True,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Measure the roofs of `device_name` ("cpu" or "cuda") with torch's current threads:
    bandwidth (unless `with_bandwidth` is False) and the matmuls of `dtypes`, in that order,
    within `budget_s` seconds (one probe may end past it by up to one of its runs; the first
    round of bandwidth probes always runs).

    Returns the fields of `results.HardwareCeilings` but `sources`, plus `skipped` (dtypes
    the budget left out) and `unsupported` (dtypes torch has no matmul for here).
    """
    import torch

    from llmbench.kernels.cpu_info import cpu_name

    deadline = time.perf_counter() + budget_s
    device = torch.device(device_name)
    is_gpu = device.type == "cuda"
    sync = torch.cuda.synchronize if is_gpu else (lambda: None)
    say = progress or (lambda message: None)
    n_min, n_max = (1024, 8192) if is_gpu else (256, 2048)
    out: dict[str, Any] = {
        "device": torch.cuda.get_device_name(device) if is_gpu else cpu_name(),
        "device_type": device.type,
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "matmul_flops_per_s": {},
        "method": f"best of repeated runs, each probe until its best {AGREE_RUNS} agree within "
        f"{AGREE_TOLERANCE:.0%} or its time ends; matmul: doubled from {n_min}x{n_min} to "
        f"{n_max}x{n_max} while a run stays under {MAX_RUN_S:g} s, up to {MAX_REPEATS} runs; "
        f"{budget_s:g} s budget",
        "notes": [],
        "probes": {},
        "skipped": [],
        "unsupported": [],
    }
    if with_bandwidth:
        say("memory bandwidth")
        _measure_bandwidth(out, device, sync, deadline)
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
        flops = 2 * n**3  # n² outputs, n multiply-adds each
        rate = flops / min(times)
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
        out["probes"][dtype] = _probe(
            n, times, flops, "FLOP/s", out["threads"], f"matmul {dtype} {n}x{n}", note
        )
    out["notes"] = _notes(out)
    return out


def _notes(roofs: dict[str, Any]) -> list[str]:
    """What to tell about a measurement: probes measured small or never agreeing, a read roof
    below one thread's (by more than the agreement tolerance), dtypes skipped or not
    available."""
    probes = roofs["probes"]
    unsettled = [
        f"{name} spread {probe['spread']:.0%}"
        for name, probe in probes.items()
        if probe.get("converged") is False
    ]
    notes = [probe["note"] for probe in probes.values() if probe.get("note")]
    if unsettled:
        notes.append(
            f"not settled (their best {AGREE_RUNS} runs were not within {AGREE_TOLERANCE:.0%} "
            f"when their time ran out): {', '.join(unsettled)}; a busy machine? re-measure "
            "on a quiet one with `llmbench hardware --refresh`"
        )
    read, alone = probes.get("read"), probes.get("read_1thread")
    beaten = (1 + AGREE_TOLERANCE) * (read or {}).get("best_per_s", 0)
    if read and alone and alone.get("best_per_s", 0) > beaten:
        notes.append(
            f"one thread read {alone['best_per_s'] / 1e9:.1f} GB/s, more than "
            f"{read['threads']} threads' {read['best_per_s'] / 1e9:.1f} GB/s (the read roof): "
            "other processes had the cores, so the roof is low"
        )
    return [
        *notes,
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
    `first` dtype first, within `budget_s`. `sources` says where each probe's number came from,
    and (`read_bytes_per_s`) which probe the read roof is.
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
    merged = {**cached, "skipped": measured["skipped"]}
    merged["matmul_flops_per_s"] = {
        **cached["matmul_flops_per_s"],
        **measured["matmul_flops_per_s"],
    }
    merged["probes"] = {**cached["probes"], **measured["probes"]}
    merged["unsupported"] = [*cached["unsupported"], *measured["unsupported"]]
    merged["notes"] = _notes(merged)
    return merged


def _read_cache(path: Path) -> dict[str, Any] | None:
    """The cache entry, or None when absent, damaged, or written in another format (an older
    llmbench's: one bandwidth method, no medians or spreads; measured again)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    if not isinstance(data, dict) or not isinstance(data.get("probes"), dict):
        return None
    if data.get("format") != CACHE_FORMAT:
        return None
    data.setdefault("unsupported", [])
    data["skipped"] = []  # what this call skips, not what an earlier one did
    data["notes"] = _notes(data)
    return data


def _write_cache(path: Path, roofs: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    kept = {k: v for k, v in roofs.items() if k != "skipped"}
    tmp.write_text(json.dumps({**kept, "format": CACHE_FORMAT}, indent=2))
    tmp.replace(path)


def _with_sources(roofs: dict[str, Any], path: Path, measured_now: set[str]) -> dict[str, Any]:
    """`roofs` without the bookkeeping keys, with `sources`: probe → "measured now" or
    "cache <file> (measured <date>)", and `read_bytes_per_s` → which probe the read roof is."""
    out = {k: v for k, v in roofs.items() if k not in ("skipped", "unsupported", "format")}
    out["sources"] = {
        name: "measured now"
        if name in measured_now
        else f"cache {path} (measured {_date(probe['measured_unix_s'])})"
        for name, probe in roofs["probes"].items()
    }
    read = roofs["probes"].get("read")
    if read is not None:
        out["sources"]["read_bytes_per_s"] = (
            f"probe read: the best {read.get('method', 'read-only sum')} over "
            f"{threads_text(read.get('threads', roofs['threads']))}, of {read['repeats']} runs"
        )
    return out


def threads_text(threads: int) -> str:
    """ "1 thread", "2 threads"."""
    return f"{threads} thread{'' if threads == 1 else 's'}"


def _date(unix_s: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(unix_s))
