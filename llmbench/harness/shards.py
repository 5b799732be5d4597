"""Sharding one seeded run across processes or hosts, and putting their records on one clock.

Shard i of N gets the sessions whose index is i modulo N (round-robin), each with the arrival
offset it has in the whole schedule, so the union of the shards is the single-process schedule
and, started together, every session is sent when the single process would send it. A closed
loop of concurrency C gives shard i C // N streams, plus one for the first C mod N shards.

Clocks. Every record holds `time.perf_counter_ns()` of the process that made it. Processes of
one host share CLOCK_MONOTONIC (`time.monotonic_ns()`) within one boot; perf_counter is not
promised to be shared (CPython on Linux reads it from CLOCK_MONOTONIC itself, elsewhere it may be
another clock). So a process reads its perf_counter − CLOCK_MONOTONIC offset (0 when both are
one clock, else read back to back), keeps it in a `ClockAnchor` with the wall clock and the boot
it belongs to; a common start is passed between processes as CLOCK_MONOTONIC and turned into the
local perf_counter (`perf_ns_of_monotonic`); and a merge moves each shard's records onto one
target clock by the difference of the two anchors (`shift_ns`): through CLOCK_MONOTONIC when both
come from one boot of one host (exact), through the wall clock otherwise (several hosts: as good
as their clock sync, NTP's milliseconds).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import platform
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from llmbench.errors import UserError

T = TypeVar("T")

BOOT_ID_FILE = Path("/proc/sys/kernel/random/boot_id")
ALIGNED_BY_MONOTONIC = "CLOCK_MONOTONIC (one boot of one host: exact)"
ALIGNED_BY_WALL_CLOCK = "wall clock (several hosts: as exact as their clock sync)"
# perf_counter is CLOCK_MONOTONIC itself (CPython on Linux): no offset to read.
_IS_PERF_MONOTONIC = (
    time.get_clock_info("perf_counter").implementation
    == time.get_clock_info("monotonic").implementation
)


@dataclass(frozen=True)
class Shard:
    """This process runs shard `index` of `count`.

    `start_at`, when given, is awaited before each repetition's load starts (once its first
    requests are prepared) and returns the `perf_counter_ns` at which the schedule's offset 0
    is: the common start of all shards. None: the shard starts on its own, at once.
    """

    index: int
    count: int
    start_at: Callable[[], Awaitable[int]] | None = None
    agreed_start_unix_s: float | None = None  # `--start-at`: the start every shard was given


@dataclass(frozen=True)
class ClockAnchor:
    """One instant on a process's clocks: how its `perf_counter_ns` records are put on another
    process's clock (`shards.shift_ns`)."""

    perf_ns: int
    monotonic_ns: int  # CLOCK_MONOTONIC: shared by the processes of one boot of one host
    unix_ns: int  # the wall clock: shared across hosts as far as their clocks are in sync
    host: str
    boot_id: str | None  # None: unknown (not Linux)


def pick(items: Sequence[T], shard: Shard | None) -> list[T]:
    """The items of `shard`: round-robin by index.

    Formula: items[j] for j ≡ index (mod count); all of them when `shard` is None.
    """
    if shard is None:
        return list(items)
    return list(items[shard.index :: shard.count])


def concurrency_of(concurrency: int, shard: Shard | None) -> int:
    """A closed loop's streams in `shard`; the shards' streams add up to `concurrency`.

    Formula: concurrency // count + (1 if index < concurrency mod count else 0).
    """
    if shard is None:
        return concurrency
    return concurrency // shard.count + (shard.index < concurrency % shard.count)


def problem(backend_kind: str, load: Any, num_sessions: int, count: int) -> str | None:
    """Why a run cannot be split into `count` processes (None: it can): only the openai backend
    drives a server from outside; every shard needs a session and, in a closed loop, a stream."""
    if count <= 1:
        return None
    if backend_kind != "openai":
        return (
            f"{count} processes need backend kind 'openai' (the {backend_kind} backend runs "
            "inside this process)"
        )
    if num_sessions < count:
        return f"{num_sessions} sessions for {count} processes: each needs at least one session"
    if load.kind == "concurrency":
        searched = () if load.search is None else (load.search.low,)
        lowest = min([load.concurrency, *(load.sweep or ()), *searched])
        if lowest < count:
            return f"concurrency {lowest:g} for {count} processes: each needs at least one stream"
    return None


def parse_shard(text: str) -> tuple[int, int]:
    """`--shard i/N` as (i, N); one line naming the option otherwise."""
    index, sep, count = text.partition("/")
    try:
        i, n = int(index), int(count)
    except ValueError:
        i = n = -1
    if not sep or n < 1 or not 0 <= i < n:
        raise UserError(f"--shard {text}: expected i/N with 0 <= i < N, e.g. --shard 0/2")
    return i, n


class _Timeval(ctypes.Structure):
    _fields_ = [("sec", ctypes.c_long), ("usec", ctypes.c_long)]


class _Timex(ctypes.Structure):
    """Linux's `struct timex` (adjtimex(2)); read only (modes 0)."""

    _fields_ = [
        ("modes", ctypes.c_uint),
        *((name, ctypes.c_long) for name in ("offset", "freq", "maxerror", "esterror")),
        ("status", ctypes.c_int),
        *((name, ctypes.c_long) for name in ("constant", "precision", "tolerance")),
        ("time", _Timeval),
        *((name, ctypes.c_long) for name in ("tick", "ppsfreq", "jitter")),
        ("shift", ctypes.c_int),
        *((name, ctypes.c_long) for name in ("stabil", "jitcnt", "calcnt", "errcnt", "stbcnt")),
        ("tai", ctypes.c_int),
        ("padding", ctypes.c_int * 11),
    ]


_TIME_ERROR = 5  # adjtimex's clock state: not synchronized


def clock_sync() -> tuple[bool | None, float | None]:
    """Whether this host's wall clock is synchronized (NTP, PTP: the kernel's view) and the
    kernel's maximum error of it in seconds: how far from true time a shard's `--start-at` can
    be. (None, None) where the kernel cannot be asked (not Linux)."""
    if not sys.platform.startswith("linux"):
        return None, None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        timex = _Timex()
        state = libc.adjtimex(ctypes.byref(timex))
    except (OSError, AttributeError):
        return None, None
    if state < 0:
        return None, None
    return state != _TIME_ERROR, timex.maxerror / 1e6


def boot_id() -> str | None:
    """This boot of this host (Linux): processes with the same one share CLOCK_MONOTONIC."""
    try:
        return BOOT_ID_FILE.read_text().strip() or None
    except OSError:
        return None


def _perf_minus_monotonic_ns() -> int:
    """perf_counter_ns − monotonic_ns now: 0 where both read the same clock (Linux), else read
    back to back (the closest of 3 reads)."""
    if _IS_PERF_MONOTONIC:
        return 0
    best_gap, best = None, 0
    for _ in range(3):
        m0 = time.monotonic_ns()
        p = time.perf_counter_ns()
        m1 = time.monotonic_ns()
        if best_gap is None or m1 - m0 < best_gap:
            best_gap, best = m1 - m0, p - (m0 + m1) // 2
    return best


def clock_anchor() -> ClockAnchor:
    """This process's clocks at one instant (see the module docstring)."""
    offset = _perf_minus_monotonic_ns()
    monotonic_ns = time.monotonic_ns()
    unix_ns = time.time_ns()
    return ClockAnchor(
        perf_ns=monotonic_ns + offset,
        monotonic_ns=monotonic_ns,
        unix_ns=unix_ns,
        host=platform.node(),
        boot_id=boot_id(),
    )


def perf_ns_of_monotonic(monotonic_ns: int) -> int:
    """A CLOCK_MONOTONIC time (from another process of this boot) on this process's
    perf_counter.

    Formula: monotonic_ns + (perf_counter_ns − monotonic_ns), both read now.
    """
    return monotonic_ns + _perf_minus_monotonic_ns()


def is_same_boot(a: ClockAnchor, b: ClockAnchor) -> bool:
    """Whether two anchors share CLOCK_MONOTONIC: one boot of one host."""
    return a.boot_id is not None and a.boot_id == b.boot_id and a.host == b.host


def shift_ns(source: ClockAnchor, target: ClockAnchor) -> int:
    """What to add to a `source` process's perf_counter_ns to put it on `target`'s.

    Formula: same boot: (target.perf − target.monotonic) − (source.perf − source.monotonic);
    otherwise (target.perf − target.unix) − (source.perf − source.unix).
    """
    if is_same_boot(source, target):
        return (target.perf_ns - target.monotonic_ns) - (source.perf_ns - source.monotonic_ns)
    return (target.perf_ns - target.unix_ns) - (source.perf_ns - source.unix_ns)


def alignment(sources: Sequence[ClockAnchor], target: ClockAnchor) -> str:
    """How records on `sources` clocks are put on `target`'s: the weakest of the ways used."""
    if all(is_same_boot(s, target) for s in sources):
        return ALIGNED_BY_MONOTONIC
    return ALIGNED_BY_WALL_CLOCK


def perf_ns_of_unix(unix_s: float) -> int:
    """A wall-clock time (seconds since the epoch) on this process's perf_counter: how
    `--start-at` starts shards on several hosts together.

    Formula: unix_s · 1e9 − time_ns() + perf_counter_ns(), both read now.
    """
    return round(unix_s * 1e9) - time.time_ns() + time.perf_counter_ns()


def from_options(text: str | None, start_unix_s: float | None, spec: Any) -> Shard | None:
    """The shard `llmbench run --shard i/N [--start-at UNIX_S]` asks for (None without
    `--shard`), checked against the spec: one line naming the option otherwise."""
    if text is None:
        if start_unix_s is not None:
            raise UserError("--start-at: only with --shard i/N")
        return None
    index, count = parse_shard(text)
    if spec.load.search is not None:
        raise UserError(
            f"--shard {text}: not with load.search (each load it runs follows from how the one "
            "before did, which a shard cannot see); search with load.workers instead"
        )
    if spec.load.workers > 1:
        raise UserError(
            f"--shard {text}: not with load.workers {spec.load.workers}; shard the run one way"
        )
    if spec.backend.reset_prefix_cache:
        raise UserError(
            f"--shard {text}: not with backend.reset_prefix_cache (a shard would empty the "
            "caches under another's requests); reset the servers before the shards start"
        )
    why = problem(spec.backend.kind, spec.load, spec.workload.sessions, count)
    if why is not None:
        raise UserError(f"--shard {text}: {why}")
    start_at = None if start_unix_s is None else _first_at(start_unix_s)
    return Shard(index, count, start_at, start_unix_s)


def _first_at(start_unix_s: float) -> Callable[[], Awaitable[int]]:
    """`start_at` for `--start-at`: the first repetition starts at that wall-clock time (at
    once, said on stderr, when it has passed), later ones when the one before ends."""
    calls = []

    async def start_at() -> int:
        now_ns = time.perf_counter_ns()
        if calls:
            return now_ns
        calls.append(now_ns)
        start_ns = perf_ns_of_unix(start_unix_s)
        if start_ns < now_ns:
            late_s = (now_ns - start_ns) / 1e9
            print(f"--start-at: {late_s:.1f} s past already; starting now", file=sys.stderr)
        return max(start_ns, now_ns)

    return start_at
