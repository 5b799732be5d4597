"""The load generator's own load: its CPU over the measured window, the cores it shares with
the server it measures, and the warnings when it may have been the bottleneck.

One asyncio process reads every stream on one core: at about 0.8 of a core busy its timings
start to include its own queueing (a chunk waits for the loop), and on a small machine a client
that shares cores with the server slows the server it is timing (a multi-process client took
157 s of CPU in a 165 s run here and made the server look 1.6–1.8× slower; pinning the two
apart fixed it). So every openai-backend run records, per client process, the user and system
CPU seconds it spent between the start of its first measured repetition and the end of its
last (`ClientMeter`, from getrusage and, per thread, /proc), the CPUs it may run on, and for a
server on loopback the server's CPUs and CPU time, and flags a saturated client or shared cores.
"""

from __future__ import annotations

import dataclasses
import os
import resource
import threading
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from llmbench.errors import UserError
from llmbench.harness import shards
from llmbench.harness.results import ClientLoad, ClientProcess, RunResult
from llmbench.harness.shards import ClockAnchor

SATURATED_BUSY = 0.8  # of one core: above this a single event loop starts to queue chunks
# A shard whose schedule began this much after the agreed `--start-at` is said to be late.
LATE_START_S = 0.1
MIN_THREAD_CPU_S = 0.01  # threads that used less are left out of `threads`


def parse_cpu_list(text: str) -> tuple[int, ...]:
    """A CPU list as `taskset -c` writes it ("1", "2-3", "0,2-3") as sorted CPU numbers; one
    line naming `--client-cpus` otherwise."""
    cpus: set[int] = set()
    for part in text.split(","):
        first, sep, last = part.strip().partition("-")
        try:
            low = int(first)
            high = int(last) if sep else low
        except ValueError:
            low, high = 0, -1
        if low < 0 or high < low:
            raise UserError(f"--client-cpus {text}: expected CPU numbers like 1 or 2-3 or 0,2-3")
        cpus.update(range(low, high + 1))
    return tuple(sorted(cpus))


def format_cpu_list(cpus: Iterable[int]) -> str:
    """CPU numbers as `taskset -c` takes them: ranges joined by commas ("0-2,5")."""
    parts: list[str] = []
    run: list[int] = []
    for cpu in sorted(set(cpus)):
        if run and cpu == run[-1] + 1:
            run.append(cpu)
            continue
        if run:
            parts.append(str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}")
        run = [cpu]
    if run:
        parts.append(str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}")
    return ",".join(parts)


def pin(cpus: Sequence[int], text: str) -> None:
    """Pin this process (every thread it has now, and so every thread and process it starts
    later) to `cpus`; `text` is what the user typed, for the one-line error."""
    available = set(range(os.cpu_count() or 1))
    outside = sorted(set(cpus) - available)
    if outside:
        raise UserError(
            f"--client-cpus {text}: no CPU {format_cpu_list(outside)} on this machine (it has "
            f"{format_cpu_list(available)})"
        )
    try:
        for tid in _thread_ids():
            os.sched_setaffinity(tid, cpus)
    except AttributeError:
        raise UserError(f"--client-cpus {text}: this OS cannot pin a process") from None
    except OSError as e:
        allowed = format_cpu_list(own_affinity())
        raise UserError(
            f"--client-cpus {text}: cannot pin to them ({e.strerror}); this process may use "
            f"CPUs {allowed}"
        ) from None


def _thread_ids() -> list[int]:
    """This process's threads (Linux: /proc/self/task; elsewhere just the process)."""
    try:
        return [int(name) for name in os.listdir("/proc/self/task")]
    except OSError:
        return [0]


@dataclass(frozen=True)
class _Snapshot:
    t_ns: int  # perf_counter_ns
    user_s: float
    system_s: float
    threads_s: Mapping[int, float]  # thread id → user + system CPU seconds so far
    thread_names: Mapping[int, str]  # of the threads alive now (they may be gone later)
    server_s: float | None  # the server processes' user + system CPU seconds so far


def _thread_times() -> dict[int, float]:
    try:
        return {t.id: t.user_time + t.system_time for t in psutil.Process().threads()}
    except (psutil.Error, OSError):
        return {}


def _server_cpu_s(pids: Sequence[int]) -> float | None:
    if not pids:
        return None
    total = 0.0
    try:
        for pid in pids:
            t = psutil.Process(pid).cpu_times()
            total += t.user + t.system + t.children_user + t.children_system
    except (psutil.Error, OSError):
        return None
    return total


def _snapshot(server_pids: Sequence[int], clock: Callable[[], int]) -> _Snapshot:
    usage = resource.getrusage(resource.RUSAGE_SELF)  # microseconds, where /proc has 10 ms ticks
    return _Snapshot(
        t_ns=clock(),
        user_s=usage.ru_utime,
        system_s=usage.ru_stime,
        threads_s=_thread_times(),
        thread_names=_thread_names(),
        server_s=_server_cpu_s(server_pids),
    )


def _thread_names() -> dict[int, str]:
    """Thread id → name: Python's name for its threads, the kernel's (comm) for the others."""
    names = {t.native_id: t.name for t in threading.enumerate() if t.native_id is not None}
    for tid in _thread_ids():
        if tid not in names:
            try:
                names[tid] = Path(f"/proc/self/task/{tid}/comm").read_text().strip()
            except OSError:
                names[tid] = f"thread {tid}"
    return names


def thread_cpu_s(
    start: Mapping[int, float], end: Mapping[int, float], names: Mapping[int, str]
) -> dict[str, float]:
    """CPU seconds of each thread alive at the end, in the window, busiest first; threads under
    `MIN_THREAD_CPU_S` left out, a name two threads share suffixed with the thread id.

    Formula: end[tid] − start.get(tid, 0) (a thread started in the window counts from 0).
    """
    used = {tid: s - start.get(tid, 0.0) for tid, s in end.items()}
    kept = sorted(
        ((tid, s) for tid, s in used.items() if s >= MIN_THREAD_CPU_S), key=lambda x: -x[1]
    )
    counts: dict[str, int] = {}
    for tid, _ in kept:
        name = names.get(tid, f"thread {tid}")
        counts[name] = counts.get(name, 0) + 1
    out: dict[str, float] = {}
    for tid, s in kept:
        name = names.get(tid, f"thread {tid}")
        out[name if counts[name] == 1 else f"{name} ({tid})"] = round(s, 3)
    return out


def busy_fraction(cpu_s: float, wall_s: float) -> float:
    """How busy a process was: 1.0 = one core all the time (a multi-threaded one can exceed it).

    Formula: cpu_s / wall_s (0 for an empty window).
    """
    return cpu_s / wall_s if wall_s > 0 else 0.0


class ClientMeter:
    """This process's CPU over the measured window, and the local server's.

    The window starts when the first measured repetition starts (`begin`, or `measure`; for a
    shard, at its common start: `starting`) and ends when the last one ends (`end`); a run
    stopped in the middle ends it when the result is made.
    """

    def __init__(
        self, server_pids: Sequence[int] = (), clock: Callable[[], int] = time.perf_counter_ns
    ):
        """`clock`: the run's clock in ns (the driver's), injected by tests of the window."""
        self.server_pids = tuple(server_pids)
        self.clock = clock
        self._start: _Snapshot | None = None
        self._end: _Snapshot | None = None
        self._has_started = False  # a common start has moved `_start` (`starting`)
        self._schedule_start_ns: int | None = None  # the first common start (perf_counter)
        self._agreed_start_unix_s: float | None = None  # the `--start-at` it was given

    def begin(self) -> None:
        if self._start is None:
            self._start = _snapshot(self.server_pids, self.clock)

    def end(self) -> None:
        if self._start is not None:
            self._end = _snapshot(self.server_pids, self.clock)

    def starting(
        self,
        start_at: Callable[[], Awaitable[int]] | None,
        agreed_start_unix_s: float | None = None,
    ) -> Callable[[], Awaitable[int]] | None:
        """`start_at` (a shard's common start) that also moves the window's start to the first
        start it gives (waiting for the other shards, or for `--start-at`, is no load) and keeps
        that start, to say in `block` how far it was from `agreed_start_unix_s`."""
        if start_at is None:
            return None
        self._agreed_start_unix_s = agreed_start_unix_s

        async def started() -> int:
            start_ns = await start_at()
            if not self._has_started:
                self._has_started = True
                self._schedule_start_ns = start_ns
                now = _snapshot(self.server_pids, self.clock)
                self._start = dataclasses.replace(now, t_ns=max(now.t_ns, start_ns))
            return start_ns

        return started

    async def measure(self, work: Awaitable[object]) -> None:
        """Await a repetition's load inside the window."""
        self.begin()
        try:
            await work
        finally:
            self.end()

    def block(self, start: ClientLoad) -> ClientLoad:
        """`start` (the shard and clock the run began with) with what was measured; as it was
        when no repetition started."""
        if self._start is None:
            return start
        end = self._end or _snapshot(self.server_pids, self.clock)
        a = self._start
        wall_s = (end.t_ns - a.t_ns) / 1e9
        user_s, system_s = end.user_s - a.user_s, end.system_s - a.system_s
        process = ClientProcess(
            shard=start.shard or 0,
            pid=os.getpid(),
            cpu_affinity=own_affinity(),
            wall_s=round(wall_s, 6),
            user_s=round(user_s, 3),
            system_s=round(system_s, 3),
            busy_fraction=round(busy_fraction(user_s + system_s, wall_s), 4),
            threads=thread_cpu_s(a.threads_s, end.threads_s, end.thread_names),
            **self._start_of_schedule(start.clock),
        )
        server_s = None
        if a.server_s is not None and end.server_s is not None:
            server_s = round(end.server_s - a.server_s, 3)
        return combine(
            start, [process], self.server_pids, server_affinity(self.server_pids), server_s
        )

    def _start_of_schedule(self, clock: ClockAnchor) -> dict[str, Any]:
        """This process's host, when its schedule began by the wall clock, how far from the
        agreed start, and how far its wall clock may be from true time (the kernel's NTP
        state); only the host without a common start.

        Formula: schedule_start_unix_s = (clock.unix_ns + start_ns − clock.perf_ns) / 1e9;
        start_offset_s = schedule_start_unix_s − agreed_start_unix_s.
        """
        if self._schedule_start_ns is None:
            return {"host": clock.host}
        unix_s = (clock.unix_ns + self._schedule_start_ns - clock.perf_ns) / 1e9
        agreed = self._agreed_start_unix_s
        synced, max_error_s = shards.clock_sync()
        return {
            "host": clock.host,
            "clock_synced": synced,
            "clock_max_error_s": max_error_s,
            "schedule_start_unix_s": round(unix_s, 6),
            "start_offset_s": None if agreed is None else round(unix_s - agreed, 6),
        }


def own_affinity() -> tuple[int, ...]:
    """The CPUs this process may run on (every CPU where the OS cannot say)."""
    try:
        return tuple(sorted(os.sched_getaffinity(0)))
    except AttributeError:  # no sched_getaffinity (macOS)
        return tuple(range(os.cpu_count() or 1))


def server_affinity(pids: Sequence[int]) -> tuple[int, ...] | None:
    """The CPUs the server processes may run on (their union); None without any, or unreadable."""
    if not pids:
        return None
    cpus: set[int] = set()
    try:
        for pid in pids:
            cpus.update(psutil.Process(pid).cpu_affinity())
    except (psutil.Error, OSError, AttributeError):  # AttributeError: no cpu_affinity here
        return None
    return tuple(sorted(cpus))


def combine(
    base: ClientLoad,
    processes: Sequence[ClientProcess],
    server_pids: Sequence[int],
    server_cpus: tuple[int, ...] | None,
    server_cpu_s: float | None,
    clock_alignment: str | None = None,
) -> ClientLoad:
    """`base` (shard, count, clock) with the figures of `processes` and the warnings they call
    for.

    Formula: cpu_s = Σ (user_s + system_s); max_busy_fraction = max busy_fraction;
    is_saturated = max_busy_fraction >= SATURATED_BUSY; shares_cores_with_server = some
    process's CPUs ∩ the server's ≠ ∅ (None without a local server).
    """
    shares = None
    if server_cpus is not None and processes:
        shares = any(set(p.cpu_affinity) & set(server_cpus) for p in processes)
    top = max((p.busy_fraction for p in processes), default=None)
    starts = [p.schedule_start_unix_s for p in processes if p.schedule_start_unix_s is not None]
    client = dataclasses.replace(
        base,
        processes=tuple(processes),
        cpu_s=round(sum(p.user_s + p.system_s for p in processes), 3) if processes else None,
        max_busy_fraction=top,
        is_saturated=top is not None and top >= SATURATED_BUSY,
        server_pids=tuple(server_pids),
        server_cpu_affinity=server_cpus,
        server_cpu_s=server_cpu_s,
        shares_cores_with_server=shares,
        clock_alignment=clock_alignment,
        start_spread_s=round(max(starts) - min(starts), 6) if len(starts) > 1 else None,
    )
    return dataclasses.replace(client, warnings=tuple(warnings(client)))


def warnings(client: ClientLoad) -> list[str]:
    """One line per problem: a saturated client process, cores shared with the server."""
    lines = []
    if client.is_saturated:
        busiest = max(client.processes, key=lambda p: p.busy_fraction)
        which = f"worker {busiest.shard} of {client.num_shards}" if client.num_shards > 1 else ""
        lines.append(
            f"the client{' ' + which if which else ''} was busy {busiest.busy_fraction:.2f} of a "
            "core: it may have been the bottleneck (spread it over more processes with "
            "load.workers, or give it a core of its own with --client-cpus)"
        )
    late = [p for p in client.processes if (p.start_offset_s or 0) > LATE_START_S]
    for p in late:
        lines.append(
            f"shard {p.shard} on {p.host} began {p.start_offset_s:.2f} s after the agreed "
            "--start-at: its schedule ran that much behind the others' (give the shards more "
            "time to start)"
        )
    if client.shares_cores_with_server:
        mine = format_cpu_list(c for p in client.processes for c in p.cpu_affinity)
        theirs = format_cpu_list(client.server_cpu_affinity or ())
        pids = ",".join(map(str, client.server_pids))
        lines.append(
            f"the client (CPUs {mine}) and the server (pid {pids}, CPUs {theirs}) may share "
            "cores: pin them apart (taskset -c <cpus> for the server, --client-cpus <others>)"
        )
    return lines


def attach(result: RunResult, client: ClientLoad | None) -> RunResult:
    """`result` with its `client` block, the block's warnings appended to `summary.warnings`."""
    if client is None:
        return result
    summary = dict(result.summary)
    if summary and client.warnings:
        summary["warnings"] = [*summary.get("warnings", []), *client.warnings]
    return dataclasses.replace(result, client=client, summary=summary)


def start_block(shard: int | None, num_shards: int, clock: ClockAnchor) -> ClientLoad:
    """The client block of `run-start.json`: which shard, on which clock; nothing measured."""
    return ClientLoad(shard=shard, num_shards=num_shards, clock=clock)


def summary_line(client: ClientLoad | None) -> str | None:
    """The summary table's line on the client: its CPU, busy fraction, and CPUs vs the
    server's; None when nothing was measured."""
    if client is None or not client.processes:
        return None
    wall_s = max(p.wall_s for p in client.processes)
    n = len(client.processes)
    who = f"{n} processes" if n > 1 else "1 process"
    mine = format_cpu_list(c for p in client.processes for c in p.cpu_affinity)
    line = (
        f"client: {client.cpu_s:.2f} CPU s in {wall_s:.1f} s ({who}, busiest "
        f"{client.max_busy_fraction:.2f} of a core) on CPUs {mine}"
    )
    if client.server_cpu_affinity is not None:
        line += f"; server on CPUs {format_cpu_list(client.server_cpu_affinity)}"
        if client.server_cpu_s is not None:
            line += f", {client.server_cpu_s:.2f} CPU s"
    return line


def start_line(client: ClientLoad | None) -> str | None:
    """How well the shards' schedules lined up (by their hosts' clocks): how far apart they
    began, and the latest one's distance from `--start-at`; None without a common start."""
    if client is None:
        return None
    offsets = [p.start_offset_s for p in client.processes if p.start_offset_s is not None]
    parts = []
    if client.start_spread_s is not None:
        parts.append(f"the shards' schedules began {client.start_spread_s * 1e3:.1f} ms apart")
    if offsets:
        parts.append(f"the latest {max(offsets) * 1e3:+.1f} ms from --start-at")
    if not parts:
        return None
    line = "start: " + ", ".join(parts) + " (by each host's wall clock"
    hosts = {p.host: p for p in client.processes if p.schedule_start_unix_s is not None}
    unsynced = sorted(h for h, p in hosts.items() if p.clock_synced is False)
    errors = [p.clock_max_error_s for p in hosts.values() if p.clock_max_error_s is not None]
    if len(hosts) > 1 and unsynced:
        line += f"; not synchronized on {', '.join(unsynced)}: the hosts may start seconds apart"
    elif len(hosts) > 1 and errors:
        line += f"; each within ±{max(errors) * 1e3:.0f} ms of true time, as their kernels say"
    return line + ")"
