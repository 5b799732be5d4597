"""Hardware ceilings: the roofs a run is placed under, measured here or read from a datasheet.

Datasheet peaks are marketing maxima; a roofline built on them makes every run look bad. So the
roofs are *measured* on the device the engine uses, with the engine's threads, and each one
several ways, repeated until it stops moving, so that a user can tell a roof from noise.

Memory bandwidth: STREAM's kernels in torch — a read-only sum (bytes read), a copy (read +
write) and a triad a = b + s·c (two reads, one write), counted as STREAM counts them (no
write-allocate traffic) — each with all of the engine's threads and with one, over buffers of
`LLC_MULTIPLE`× the last-level cache (`buffer_bytes`). A reported cache above `MAX_LLC_BYTES` is
not believed (a VM reports its host's: 300 MiB here, which asked for 2.4 GiB buffers, a 7.6 GB
peak), and a round's buffers together take at most `MAX_PROBE_BYTES` and half of available memory
(1 GiB each on a GPU): out of cache, and the probes stay under 1 GB of RSS. The read probes read
one buffer of the round's whole share (3 × `buffer_bytes`: a VM's real L3 may hold much of one
192 MiB buffer), and every CPU buffer is asked onto huge pages (`huge_pages`: where they are
`always`, one allocation may land on them and the next not — 42 or 72 GB/s read on one
machine; where `madvise`, torch's buffers never do). The runs go in rounds, each on freshly
allocated buffers, until the best `AGREE_RUNS` runs of every probe agree within
`AGREE_TOLERANCE`, a probe at all threads is not slower than at one (`is_bandwidth_settled`:
a host that runs a VM's vCPUs on one core halves the read) and the read's best was reached on
two allocations (`is_reproduced`), or the bandwidth's share of the budget ends; each probe
keeps every allocation's best (`allocation_best_per_s`, noted when they are more than
`ALLOCATION_TOLERANCE` apart). The deadline is checked before every timed run (`timed_runs`):
on a loaded machine, where one run takes many times its usual time, the budget is overrun by
one run at most (`read` and `copy` get one run whatever the time: a run needs both; so does
the matmul of the dtype a run computes in, at the smallest size). Every
probe keeps its best and median rate and the spread of its runs (`run_stats`). The roof MBU
divides by is the best read-only sum at all threads (probe `read`;
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
Results are cached per device, thread count and torch version, each probe with its date and the
machine's load around it; `ceilings` measures only what the cache lacks, and says where each
number came from; `llmbench hardware --refresh` measures everything again. A cache entry written
before these probes existed (no `format` `CACHE_FORMAT`) is measured again. One whose read has
no `allocation_best_per_s` (measured before huge pages and the 576 MiB read buffer: 24-29 GB/s
read here where the probe now reads 28.4-29.7) is used as it is, like a hand-written one, until
`--refresh`: a cached roof holds still. Each format has a file of its own (format 3's is
`<key>.json`, later ones `<key>.format<N>.json`; a newer format reads the file of format 3 until
it has its own), so two versions of llmbench sharing one cache (the sides of `llmbench ab`)
never read entries the other wrote in a format they do not know.

Roofs measured on a busy machine are wrong by large factors (two refreshes minutes apart here:
read 13.1 vs 6.9 GB/s, bfloat16 2,207 vs 303 GFLOP/s), and a cached one poisoned every later MBU.
So the caller passes `watch_load` (`provenance.LoadMonitor`: other processes' CPU in the second
before and during the measurement) and each probe is cached with that reading (`probe_loads`):
a probe measured busy is cached *marked busy*, never as the machine's. A later call that watches
measures it again when the machine is quiet then (it uses the busy one, said so, when the
machine is still busy: re-measuring on a busy machine only costs the budget again; so does a
call that does not watch, which cannot tell); a busy measurement never replaces a quiet one in
the cache (`--refresh` on a busy machine shows what it measured and keeps the quiet roofs). A
probe measured without `watch_load` (load unknown) is measured again the same way; a probe with
no load record at all (hand-written) is taken as quiet.
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
from typing import Any, Protocol

from llmbench.kernels.cpu_info import cpu_name, multiplies_in_float32, this_cpu_flags
from llmbench.roofline import huge_pages

DEFAULT_BUDGET_S = 60.0  # all the probes of one measurement
BANDWIDTH_BUDGET_S = 20.0  # the bandwidth probes' share of it, at most
PROBE_CAP_S = 10.0  # one matmul probe at most
MAX_RUN_S = 0.75  # a matmul stops growing before one run would take longer than this
MAX_REPEATS = 10  # timed runs per matmul probe at most
AGREE_RUNS = 3  # a probe has converged when its best this many runs ...
AGREE_TOLERANCE = 0.03  # ... are within this fraction of each other
BANDWIDTH_RUNS = 3  # timed runs per bandwidth probe in one round (one set of fresh buffers)
BANDWIDTH_MIN_ROUNDS = 2  # fresh allocations every bandwidth probe gets, time allowing
BANDWIDTH_MAX_ROUNDS = 8
# A read probe whose fresh allocations' best runs are further apart than this is noted: the
# bandwidth moved while it was measured (issue 21's bound for a normaliser that holds still).
ALLOCATION_TOLERANCE = 0.05
LLC_MULTIPLE = 4  # a bandwidth buffer this many times the last-level cache is out of it
# A reported last-level cache above this is not believed: a VM reports its host's (300 MiB on
# this project's 2-core VMs), not its share; the L3 of a 2-24 core slice is 4-48 MiB.
MAX_LLC_BYTES = 48 << 20
MIN_BUFFER_BYTES = 128 << 20  # a buffer is at least this (4x a 32 MiB L3)
# The buffers of one round together (three for the triad) take at most this, and at most
# MAX_MEMORY_SHARE of available memory: with torch's ~220 MiB the probes stay under 1 GB RSS,
# and a run's (its engine loaded: the main job's ~1.2 GB) under 2 GB.
MAX_PROBE_BYTES = 576 << 20
MAX_MEMORY_SHARE = 0.5
GPU_BUFFER_BYTES = 1 << 30  # device memory, not RSS
# Cache entries of another format are measured again (2: no load recorded). 4: the probes carry
# `allocation_best_per_s`, which a llmbench of format 3 does not know (its strict reader refuses
# unknown keys); format 3 entries lack it and are read as they are.
CACHE_FORMAT = 4
READABLE_FORMATS = (3, CACHE_FORMAT)
MATMUL_DTYPES = ("float32", "bfloat16", "float16", "int8")
FLOAT32_PRODUCTS = ", products in float32"  # ends the method of a probe that multiplied so
# A dtype measured small and this many times slower than the fastest dtype measured before it
# in the same call is said to have no fast path on the device.
_SLOW_FACTOR = 10

Progress = Callable[[str], None]
Clock = Callable[[], float]  # seconds, monotonic (time.perf_counter); a test's scripted clock


class LoadWatch(Protocol):
    """How busy the machine is around a measurement (`provenance.LoadMonitor`): entered around
    it; `load()` inside says the second before, after it also the time during (a
    `results.MachineLoad`: `is_busy`, `other_processes_cores_before`, `other_processes_cores`,
    `cpu_count`)."""

    def __enter__(self) -> LoadWatch: ...

    def __exit__(self, *exc: object) -> object: ...

    def load(self) -> Any: ...


def _cache_path(key: str, cache_format: int = CACHE_FORMAT) -> Path:
    """The cache file of `key` in `cache_format`: `<key>.json` for format 3 (the files written
    before formats had files of their own), `<key>.format<N>.json` after it."""
    base = Path(os.environ.get("LLMBENCH_CACHE") or Path.home() / ".cache" / "llmbench")
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in key)
    suffix = "" if cache_format <= 3 else f".format{cache_format}"
    return base / "hardware" / f"{safe}{suffix}.json"


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


def allocation_spread(rates: Sequence[float]) -> dict[str, float]:
    """A bandwidth probe's fresh allocations, each as its best run's rate: how far apart they
    were (a machine whose bandwidth moves between allocations, or one buffer placed worse).

    Formula: min_per_s = min(r); median_per_s = median(r); max_per_s = max(r);
    spread = 1 − min(r) / max(r).
    """
    return {
        "min_per_s": min(rates),
        "median_per_s": statistics.median(rates),
        "max_per_s": max(rates),
        "spread": 1 - min(rates) / max(rates),
    }


def is_bandwidth_settled(name: str, times: dict[str, list[float]]) -> bool:
    """Whether bandwidth probe `name` is done: its runs have converged and, for a probe at all
    threads, its best is not slower than its one-thread peer's (`<name>_1thread`, the same
    bytes) beyond the tolerance. All threads slower than one is no roof: the cores were not all
    there (other processes, or a host that ran this VM's vCPUs on one core: read 12.6 GB/s at 2
    threads, 15.1 at one, 29.8 a second later here), so its rounds go on while time is left.

    Formula: has_converged(t[name]) and (no runs of peer or
    min(t[name]) <= (1 + AGREE_TOLERANCE) · min(t[peer])).
    """
    peer = times.get(f"{name}_1thread")
    if not has_converged(times[name]):
        return False
    return not peer or min(times[name]) <= (1 + AGREE_TOLERANCE) * min(peer)


def is_reproduced(rates: Sequence[float], tolerance: float = AGREE_TOLERANCE) -> bool:
    """Whether a probe's best rate was reached on two of its fresh allocations (`rates`: each
    one's best), not on one lucky buffer or in one good second: the read roof is settled only
    then. Here a round that caught the end of a slow moment read 27.8 GB/s where its neighbours
    read 29.3-30.0.

    Formula: with r sorted descending, len(r) >= 2 and r[1] >= (1 − tolerance) · r[0].
    """
    best = sorted(rates, reverse=True)[:2]
    return len(best) == 2 and best[1] >= (1 - tolerance) * best[0]


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
    is_settled: Callable[[str, dict[str, list[float]]], bool] | None = None,
) -> dict[str, list[float]]:
    """Each named probe's run times over rounds: `time_round(pending)` times every pending probe
    a few runs (on fresh buffers; within a round `timed_runs` stops a probe at the deadline) →
    name → seconds. Every probe runs in the first `min_rounds` rounds, later only the probes not
    yet settled (`is_settled(name, times)`; default: its runs `has_converged`); rounds stop when
    all have settled (after `min_rounds`), after `max_rounds`, or when `is_out_of_time()` after
    a round."""
    settled = is_settled or (lambda name, times: has_converged(times[name]))
    times: dict[str, list[float]] = {name: [] for name in names}
    for round_number in range(1, max_rounds + 1):
        pending = [name for name in names if round_number <= min_rounds or not settled(name, times)]
        if not pending:
            break
        for name, seconds in time_round(pending).items():
            times[name] += seconds
        if is_out_of_time():
            break
    return times


def timed_runs(
    time_run: Callable[[], float],
    num_runs: int,
    is_out_of_time: Callable[[], bool],
    min_runs: int = 0,
    warm_up: Callable[[], object] | None = None,
) -> list[float]:
    """Up to `num_runs` runs of `time_run` (one timed run → its seconds), each started only while
    `is_out_of_time()` is False, the first `min_runs` whatever the time; `warm_up` runs once
    before the first of them (not when none runs). Checked before every run, not per probe: on a
    loaded machine one run may take many times its usual time, so the budget is overrun by one
    run at most."""
    seconds: list[float] = []
    for _ in range(num_runs):
        if len(seconds) >= min_runs and is_out_of_time():
            break
        if warm_up is not None and not seconds:
            warm_up()
        seconds.append(time_run())
    return seconds


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

    Formula: with the triad's three buffers sharing cap = min(MAX_PROBE_BYTES,
    MAX_MEMORY_SHARE · available) (available unknown: MAX_PROBE_BYTES),
    min(max(LLC_MULTIPLE · min(llc, MAX_LLC_BYTES), MIN_BUFFER_BYTES), cap / 3) in whole MiB
    (llc unknown: cap / 3). A reported LLC of 300 MiB is believed as 48 MiB: 192 MiB buffers,
    576 MiB for the triad's three, not 3 · 8 · 300 MiB = 7 GiB.
    """
    per_probe = MAX_PROBE_BYTES // 3 >> 20 << 20
    wanted = per_probe
    if llc is not None:
        wanted = min(max(LLC_MULTIPLE * min(llc, MAX_LLC_BYTES), MIN_BUFFER_BYTES), per_probe)
    if available is None or 3 * wanted <= MAX_MEMORY_SHARE * available:
        return wanted, None
    capped = int(MAX_MEMORY_SHARE * available / 3) >> 20 << 20
    return capped, (
        f"bandwidth buffers {capped >> 20} MiB, not {wanted >> 20} MiB ({LLC_MULTIPLE}x the "
        f"last-level cache): memory is short; part of each run may come from cache"
    )


# --- measuring -------------------------------------------------------------------------------


def _timed_once(fn: Callable[[], object], sync: Callable[[], None], clock: Clock) -> float:
    t0 = clock()
    fn()
    sync()
    return clock() - t0


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


# How a bandwidth probe runs: kernel name → (buffers) → one run, and how a buffer is made.
# Module attributes so a test can put in runs that take a scripted time and no memory.
KERNEL_RUN: Callable[[str, list[Any]], Callable[[], object]] = _kernel_run
NEW_BUFFER: Callable[[int, Any], Any] = huge_pages.new_buffer


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
    clock: Clock = time.perf_counter,
) -> tuple[int, list[float]]:
    """An n×n matmul probe sized by time: (n, seconds of each timed run at that n).

    From `n_min`, each size runs once as a warm-up and twice timed (the second only while
    `cap_s` is not spent); it doubles while the doubled size is at most `n_max`, one run of it
    would take at most MAX_RUN_S (8× the faster run: n³ work) and its three runs fit in
    `cap_s`. A dtype with a fast path reaches `n_max`; one without stops where a run gets slow.
    Then `repeat_until_agreed` times it within `cap_s`.
    """
    start = clock()

    def is_out_of_time(next_s: float = 0.0) -> bool:
        return clock() - start + next_s > cap_s

    n = n_min
    while True:
        fn = make(n)
        fn()  # warm-up: first-call costs (page faults, kernel selection) stay out of the time
        sync()
        times = timed_runs(lambda f=fn: _timed_once(f, sync, clock), 2, is_out_of_time, 1)
        next_s = 8 * min(times)
        if 2 * n > n_max or next_s > MAX_RUN_S or is_out_of_time(3 * next_s):
            break
        n *= 2
    return n, repeat_until_agreed(lambda: _timed_once(fn, sync, clock), times, is_out_of_time)


def _matmul(dtype: str, n: int, device: Any) -> Callable[[], object]:
    """One n×n by n×n matmul of `dtype`, ready to run (int8 multiplies into int32; bfloat16
    on a CPU without bfloat16 products converts both to float32 first, as the engine does)."""
    import torch

    if dtype == "int8":
        a = torch.randint(-128, 128, (n, n), dtype=torch.int8, device=device)
        b = torch.randint(-128, 128, (n, n), dtype=torch.int8, device=device)
        return lambda: torch._int_mm(a, b)
    a = torch.randn(n, n, device=device).to(getattr(torch, dtype))
    b = torch.randn(n, n, device=device).to(getattr(torch, dtype))
    if multiplies_in_float32(dtype, device.type, this_cpu_flags()):
        return lambda: torch.mm(a.float(), b.float()).to(a.dtype)
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
    allocation_best_per_s: list[float] | None = None,
    converged: bool | None = None,
) -> dict[str, Any]:
    """One probe as cached and recorded (`results.Probe`); `allocation_best_per_s`: a
    bandwidth probe's best rate on each fresh allocation, in order; `converged` (None: its runs
    `has_converged`)."""
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
        "converged": has_converged(seconds) if converged is None else converged,
        "allocation_best_per_s": allocation_best_per_s,
    }


# A run needs these two (`read_bytes_per_s`, `copy_bytes_per_s`): their first round gives each
# one timed run whatever the time.
_REQUIRED_PROBES = ("read", "copy")


def _measure_bandwidth(
    out: dict[str, Any], device: Any, sync: Callable[[], None], deadline: float, clock: Clock
) -> None:
    """The bandwidth probes into `out` (`probes`, `read_bytes_per_s`, `copy_bytes_per_s`).

    The read probes come first in a round, over one buffer of the round's whole share (3 ×
    `buffer_bytes`: 576 MiB on a CPU, where this project's VMs keep much of a 192 MiB buffer
    in their large real L3 — on huge pages a read over 192 MiB ran 29-34 GB/s here, over
    384 MiB to 1 GiB 29.3-29.6), freed before copy and triad make theirs: a round never holds
    more than `MAX_PROBE_BYTES`. Every buffer is asked onto huge pages (`huge_pages`).
    """
    is_gpu = device.type == "cuda"
    llc = None if is_gpu else llc_bytes()
    size, size_note = (
        (GPU_BUFFER_BYTES, None) if is_gpu else buffer_bytes(llc, mem_available_bytes())
    )
    read_size = size if is_gpu else 3 * size  # the read's one buffer takes the triad's three
    all_threads = out["threads"]
    thread_counts = [all_threads] if is_gpu or all_threads == 1 else [all_threads, 1]
    # Both reads first (a round makes their buffer, then the others'); `read` before `copy`:
    # the two a run needs.
    read, *others = BANDWIDTH_KERNELS
    probes = {
        probe_name(read.name, threads, all_threads): (read, threads) for threads in thread_counts
    }
    probes |= {
        probe_name(kernel.name, threads, all_threads): (kernel, threads)
        for threads in thread_counts
        for kernel in others
    }
    end = min(deadline, clock() + BANDWIDTH_BUDGET_S)

    def is_out_of_time() -> bool:
        return clock() >= end

    timed: dict[str, int] = dict.fromkeys(probes, 0)  # timed runs so far, over the rounds
    allocation_best: dict[str, list[float]] = {name: [] for name in probes}
    huge_shares: list[float] = []  # of each read buffer made: the share on huge pages

    def time_round(pending: list[str]) -> dict[str, list[float]]:
        buffers: list[Any] = []  # made as the probes need them: a round cut short makes fewer
        buffers_for = "read"
        seconds = {}
        for name in pending:
            kernel, threads = probes[name]
            is_read = kernel.name == "read"
            if is_read != (buffers_for == "read"):
                buffers.clear()  # the read's buffer goes before the others are made
                buffers_for = kernel.name
            is_required = name in _REQUIRED_PROBES and not timed[name]
            while len(buffers) < kernel.num_buffers and (is_required or not is_out_of_time()):
                if is_read:
                    huge_before = huge_pages.anon_huge_page_bytes()
                    buffers.append(NEW_BUFFER(read_size, device))
                    share = huge_pages.huge_share(
                        huge_before, huge_pages.anon_huge_page_bytes(), read_size
                    )
                    if share is not None and not is_gpu:
                        huge_shares.append(share)
                else:
                    buffers.append(NEW_BUFFER(size, device))
            if len(buffers) < kernel.num_buffers:
                seconds[name] = []
                continue
            with _num_threads(threads):
                run = KERNEL_RUN(kernel.name, buffers)
                # The warm-up keeps page faults and thread start-up out of the time.
                seconds[name] = timed_runs(
                    lambda r=run: _timed_once(r, sync, clock),
                    BANDWIDTH_RUNS,
                    is_out_of_time,
                    min_runs=1 if is_required else 0,
                    warm_up=lambda r=run: (r(), sync()),
                )
            del run  # it holds the buffers: the read's must go before the others are made
            timed[name] += len(seconds[name])
            if seconds[name]:
                moved = kernel.moved * (read_size if is_read else size)
                allocation_best[name].append(moved / min(seconds[name]))
        del buffers
        return seconds

    def is_settled(name: str, times: dict[str, list[float]]) -> bool:
        # The roof MBU divides by must also be seen on two allocations.
        is_roof = name == "read"
        return is_bandwidth_settled(name, times) and (
            not is_roof or is_reproduced(allocation_best[name])
        )

    times = rounds_until_agreed(list(probes), time_round, is_out_of_time, is_settled=is_settled)
    for name, seconds in times.items():
        kernel, threads = probes[name]
        probe_size = read_size if kernel.name == "read" else size
        if seconds:
            out["probes"][name] = _probe(
                probe_size,
                seconds,
                kernel.moved * probe_size,
                "B/s",
                threads,
                kernel.label,
                allocation_best_per_s=allocation_best[name],
                converged=is_settled(name, times),
            )
    out["read_bytes_per_s"] = out["probes"]["read"]["best_per_s"]
    out["copy_bytes_per_s"] = out["probes"]["copy"]["best_per_s"]
    if size_note:
        out["probes"]["read"]["note"] = size_note
    out["skipped"] += [name for name, seconds in times.items() if not seconds]
    believed = "" if llc is None or llc <= MAX_LLC_BYTES else f", {_mib(MAX_LLC_BYTES)} believed"
    out["method"] += (
        f"; bandwidth: {', '.join(k.label for k in BANDWIDTH_KERNELS)} at "
        f"{' and '.join(str(t) for t in thread_counts)} threads over {size >> 20} MiB buffers "
        f"(read: one of {read_size >> 20} MiB; last-level cache "
        f"{_mib(llc) if not is_gpu else '-'}{believed}), {pages_text(huge_shares)}, "
        f"{BANDWIDTH_RUNS} runs per round on fresh buffers, {BANDWIDTH_MIN_ROUNDS} to "
        f"{BANDWIDTH_MAX_ROUNDS} rounds within {BANDWIDTH_BUDGET_S:g} s"
    )


def pages_text(huge_shares: Sequence[float]) -> str:
    """What pages the read buffers got: `on huge pages (100% of 2 read buffers)`, `on 4 KiB
    pages (huge pages asked for, not given)`, or `pages not known` (no smaps_rollup, a GPU)."""
    if not huge_shares:
        return "pages not known"
    share = statistics.mean(huge_shares)
    if share == 0:
        return "on 4 KiB pages (huge pages asked for, not given)"
    num = len(huge_shares)
    return f"on huge pages ({share:.0%} of {num} read buffer{'' if num == 1 else 's'})"


def _mib(num_bytes: int | None) -> str:
    return "unknown" if num_bytes is None else f"{num_bytes >> 20} MiB"


def measure(
    device_name: str = "cpu",
    budget_s: float = DEFAULT_BUDGET_S,
    dtypes: Iterable[str] = MATMUL_DTYPES,
    with_bandwidth: bool = True,
    progress: Progress | None = None,
    clock: Clock = time.perf_counter,
    needed: str | None = None,
) -> dict[str, Any]:
    """Measure the roofs of `device_name` ("cpu" or "cuda") with torch's current threads:
    bandwidth (unless `with_bandwidth` is False) and the matmuls of `dtypes`, in that order,
    within `budget_s` seconds of `clock`, checked before every timed run: the call ends past it
    by one run and its warm-up at most, besides the one run each of `read` and `copy`, and of
    the `needed` dtype's matmul at the smallest size, that a run needs whatever the time.

    Returns the fields of `results.HardwareCeilings` but `sources`, plus `skipped` (dtypes and
    bandwidth probes the budget left out) and `unsupported` (dtypes torch has no matmul for
    here).
    """
    import torch

    deadline = clock() + budget_s
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
        _measure_bandwidth(out, device, sync, deadline, clock)
    for dtype in dtypes:
        left_s = max(0.0, deadline - clock())
        if left_s == 0 and dtype != needed:
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
                clock,
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
        method = f"matmul {dtype} {n}x{n}"
        if multiplies_in_float32(dtype, device.type, this_cpu_flags()):
            method += FLOAT32_PRODUCTS
        out["probes"][dtype] = _probe(n, times, flops, "FLOP/s", out["threads"], method, note)
    out["notes"] = _notes(out)
    return out


def _notes(roofs: dict[str, Any]) -> list[str]:
    """What to tell about a measurement: probes measured on a busy machine, measured small or
    never agreeing, a read roof below one thread's (by more than the agreement tolerance),
    dtypes skipped or not available."""
    probes = roofs["probes"]
    loads = roofs.get("probe_loads", {})
    busy = [name for name in probes if (loads.get(name) or {}).get("is_busy")]
    unsettled = [
        f"{name} spread {probe['spread']:.0%}"
        for name, probe in probes.items()
        if probe.get("converged") is False
    ]
    notes = [probe["note"] for probe in probes.values() if probe.get("note")]
    if busy:
        notes.insert(0, busy_note(busy, [loads[name] for name in busy]))
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
            "other processes, or the VM's host, had the cores, so the roof is low"
        )
    moved = allocations_note(read)
    if moved:
        notes.append(moved)
    return [
        *notes,
        *(
            f"matmul {name}: not measured, the time budget was spent (a later run measures it)"
            if name in MATMUL_DTYPES
            else f"bandwidth {name}: not measured, the time budget was spent"
            for name in roofs["skipped"]
        ),
        *(f"matmul {dtype}: torch has none on this device" for dtype in roofs["unsupported"]),
    ]


def allocations_note(read: dict[str, Any] | None) -> str | None:
    """A line when the read probe's fresh allocations disagreed beyond `ALLOCATION_TOLERANCE`
    (their best runs' spread, `allocation_spread`): the bandwidth moved while it was measured,
    and an MBU divided by it carries that. None when they agreed, or were not recorded."""
    rates = (read or {}).get("allocation_best_per_s") or []
    if len(rates) < 2:
        return None
    moved = allocation_spread(rates)
    if moved["spread"] <= ALLOCATION_TOLERANCE:
        return None
    return (
        f"read: the best runs of its {len(rates)} allocations ranged "
        f"{moved['min_per_s'] / 1e9:.1f}-{moved['max_per_s'] / 1e9:.1f} GB/s (median "
        f"{moved['median_per_s'] / 1e9:.1f}): the machine's bandwidth moved while it was "
        "measured; the roof is the best"
    )


BUSY_NOTE_START = "measured on a busy machine"


def busy_cores_text(loads: Sequence[dict[str, Any]]) -> str:
    """`other processes used up to 0.90 of 2 cores`: the most other processes used, before or
    during, over the load readings of busy probes."""
    cores = max(
        max(load["other_processes_cores_before"] or 0, load["other_processes_cores"] or 0)
        for load in loads
    )
    return f"other processes used up to {cores:.2f} of {loads[0]['cpu_count']} cores"


def busy_note(names: Sequence[str], loads: Sequence[dict[str, Any]]) -> str:
    """The note for probes measured while other processes kept the machine busy."""
    return (
        f"{BUSY_NOTE_START} ({busy_cores_text(loads)}): {', '.join(names)}; cached marked busy, "
        "not as this machine's roofs, and measured again by the next run on a quiet machine"
    )


def ceilings(
    device_name: str = "cpu",
    refresh: bool = False,
    budget_s: float = DEFAULT_BUDGET_S,
    first: str | None = None,
    progress: Progress | None = None,
    watch_load: Callable[[], LoadWatch] | None = None,
) -> dict[str, Any]:
    """This device's roofs (the fields of `results.HardwareCeilings`, and `probe_loads`): from
    the cache for this device, thread count and torch, measuring only what it lacks (everything
    with `refresh`), `first` dtype first (measured even past `budget_s`, once at the smallest
    size: the run that asks needs it), within `budget_s`. `sources` says where each probe's
    number came from, and (`read_bytes_per_s`) which probe the read roof is.

    `watch_load()` (`provenance.LoadMonitor`) watches the machine around a measurement;
    `probe_loads` gives each probe's reading (None: not watched). A cached probe measured busy
    or not watched is measured again by a call that watches and finds the machine quiet now (a
    call that does not watch cannot tell, and uses the cache); a busy measurement is cached
    marked busy and never replaces a quiet one (the module's docstring says why).
    """
    import torch

    key = f"{device_name}-{torch.get_num_threads()}threads-torch{torch.__version__}"
    if device_name == "cuda":
        key = f"{torch.cuda.get_device_name()}-{key}"
    path = source = _cache_path(key)
    previous = _read_cache(path)
    if previous is None:  # a cache of the format before this one's: read, never written
        source = _cache_path(key, READABLE_FORMATS[0])
        previous = _read_cache(source)
    cached = None if refresh else previous
    order = sorted(MATMUL_DTYPES, key=lambda d: d != first)
    known = set()
    if cached is not None:
        known = {*cached["matmul_flops_per_s"], *cached["unsupported"]}
        known -= _multiplied_otherwise(cached, device_name)
    missing = [d for d in order if d not in known]
    # Only a call that watches the load can tell the machine is quiet now: worth measuring again.
    stale = [] if cached is None or watch_load is None else _stale_probes(cached)
    if cached is not None and not missing and not stale:
        return _with_sources(cached, source, set())
    watch = watch_load() if watch_load is not None else None
    with watch if watch is not None else contextlib.nullcontext():
        if watch is not None and watch.load().is_busy:
            stale = []  # busy now too: measuring again would give busy numbers, for the budget
            if cached is not None and not missing:
                return _with_sources(cached, source, set())
        dtypes = [d for d in order if d in missing or d in stale]
        with_bandwidth = cached is None or "read" in stale
        measured = measure(device_name, budget_s, dtypes, with_bandwidth, progress, needed=first)
    load = None if watch is None else _load_record(watch.load())
    measured["probe_loads"] = dict.fromkeys(measured["probes"], load)
    roofs = _combine(cached, measured, set(measured["probes"]))
    is_busy = load is not None and load["is_busy"]
    kept = set()  # quiet roofs in the cache that a busy measurement does not replace
    if is_busy and previous is not None:
        kept = {name for name in measured["probes"] if _is_quiet(previous, name)}
    _write_cache(path, _combine(previous, measured, set(measured["probes"]) - kept))
    if kept:
        roofs["notes"].append(
            f"{', '.join(sorted(kept))}: not cached, measured on a busy machine; the cache keeps "
            "the quiet measurement (`llmbench hardware` shows it)"
        )
    return _with_sources(roofs, path, set(measured["probes"]))


def _multiplied_otherwise(cached: dict[str, Any], device_name: str) -> set[str]:
    """The cached matmul probes that multiplied in another dtype than this llmbench's probe
    does here (a bfloat16 roof cached before it multiplied in float32 on a CPU without
    bfloat16 products: torch's slow path, 1.3 GFLOP/s where the engine's reaches 137). Only
    the probe's own entries are judged (a hand-written one holds still)."""
    flags = this_cpu_flags()
    out = set()
    for dtype in MATMUL_DTYPES:
        method = cached["probes"].get(dtype, {}).get("method", "")
        if method.startswith(f"matmul {dtype} ") and method.endswith(
            FLOAT32_PRODUCTS
        ) != multiplies_in_float32(dtype, device_name, flags):
            out.add(dtype)
    return out


def _load_record(load: Any) -> dict[str, Any]:
    """A `LoadWatch` reading as cached with each probe."""
    return {
        "is_busy": bool(load.is_busy),
        "cpu_count": load.cpu_count,
        "other_processes_cores_before": load.other_processes_cores_before,
        "other_processes_cores": load.other_processes_cores,
    }


def _is_quiet(roofs: dict[str, Any], name: str) -> bool:
    """Whether probe `name` of `roofs` was measured on a quiet machine: its load watched and not
    busy, or no load record at all (a hand-written cache entry)."""
    loads = roofs.get("probe_loads", {})
    if name not in roofs["probes"]:
        return False
    if name not in loads:
        return True
    return loads[name] is not None and not loads[name]["is_busy"]


def _stale_probes(cached: dict[str, Any]) -> list[str]:
    """Cached probes worth measuring again on a quiet machine: measured busy, or with the load
    not watched. `read` stands for the bandwidth probes, measured together."""
    loads = cached.get("probe_loads", {})
    return [
        name
        for name in ("read", *cached["matmul_flops_per_s"])
        if name in loads and (loads[name] is None or loads[name]["is_busy"])
    ]


def _combine(
    base: dict[str, Any] | None, measured: dict[str, Any], taken: set[str]
) -> dict[str, Any]:
    """`base` (None: nothing) with the probes `taken` from `measured` (their rates and load
    readings with them); what `measured` found unsupported or skipped is added."""
    if base is None:
        base = {**measured, "matmul_flops_per_s": {}, "probes": {}, "probe_loads": {}}
        base.pop("read_bytes_per_s", None)
        base.pop("copy_bytes_per_s", None)
        base["unsupported"] = []
    out = {**base, "skipped": measured["skipped"]}
    out["probes"] = {**base["probes"]}
    out["probe_loads"] = {**base.get("probe_loads", {})}
    out["matmul_flops_per_s"] = {**base["matmul_flops_per_s"]}
    for name in (name for name in measured["probes"] if name in taken):
        out["probes"][name] = measured["probes"][name]
        out["probe_loads"][name] = measured["probe_loads"][name]
        if name in measured["matmul_flops_per_s"]:
            out["matmul_flops_per_s"][name] = measured["matmul_flops_per_s"][name]
    for name, field in (("read", "read_bytes_per_s"), ("copy", "copy_bytes_per_s")):
        if name in taken:
            out[field] = measured[field]
    if "read" in taken:  # the method names the bandwidth probes' buffers
        out["method"] = measured["method"]
    out["unsupported"] = [*base["unsupported"], *measured["unsupported"]]
    out["notes"] = _notes(out)
    return out


def _read_cache(path: Path) -> dict[str, Any] | None:
    """The cache entry, or None when absent, damaged, or written in another format (an older
    llmbench's: one bandwidth method, no medians or spreads; measured again)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    if not isinstance(data, dict) or not isinstance(data.get("probes"), dict):
        return None
    if data.get("format") not in READABLE_FORMATS:
        return None
    data.setdefault("unsupported", [])
    data.setdefault("probe_loads", {})
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
        else f"cache {path} (measured {date_text(probe['measured_unix_s'])})"
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


def date_text(unix_s: float) -> str:
    """A wall-clock time as `2026-11-26 14:02` (local time)."""
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(unix_s))
