"""Where a run's numbers come from: git sha, versions, host, device, model, hashes, and how busy
the machine was around it — what makes two runs comparable.
"""

from __future__ import annotations

import os
import platform
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import psutil

from llmbench.harness.results import Device, HardwareCeilings, MachineLoad, Provenance
from llmbench.kernels.cpu_info import cpu_name

# The packages whose versions a result records: the ones that change the numbers.
_VERSIONED_PACKAGES = ("llmbench", "torch", "transformers", "aiohttp")


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


# Holds `$Format:%H$` in a checkout; `git archive` writes the commit there (.gitattributes).
ARCHIVED_COMMIT = Path(__file__).resolve().parents[1] / "COMMIT"


def git_sha() -> str | None:
    """The commit of the llmbench source in use: the one `git archive` wrote into
    `ARCHIVED_COMMIT` (a build of a git ref, `llmbench ab`), else the checkout's HEAD (with
    "-dirty" when tracked files changed); None outside both."""
    try:
        archived = ARCHIVED_COMMIT.read_text().strip()
    except OSError:
        archived = ""
    if re.fullmatch(r"[0-9a-f]{40}", archived):
        return archived
    here = Path(__file__).resolve().parent
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=5
        )
        if out.returncode != 0:
            return None
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=here,
            capture_output=True,
            text=True,
            timeout=5,
        ).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() + ("-dirty" if dirty else "")


def device_of(
    backend_kind: str, backend: Any, url: str | None, hardware: str | None = None
) -> Device:
    """What ran the model: this CPU or GPU (engine, transformers), or a server at `url` known by
    its identity (`OpenAIBackend.identity`: kind, version, served model, and the `hardware`
    declared for it — "measured", a server on this machine, names this CPU)."""
    if backend_kind == "openai":
        on = cpu_name() if hardware == "measured" else hardware
        return Device(type="remote", name=backend.identity(on), url=url)
    import torch

    if backend_kind == "transformers":
        return Device("cpu", cpu_name(), torch.get_num_threads(), "transformers.generate")
    device = backend.engine.device
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_name()
    kernels = backend.engine.model.kernels_description  # the kernels layer's dispatch
    pages = backend.engine.weight_pages
    on_huge_pages = None if pages is None else pages.huge_share
    return Device(device.type, name, torch.get_num_threads(), kernels, None, on_huge_pages)


def collect(
    spec_dict: dict[str, Any],
    spec_hash: str,
    workload_hash: str,
    device: Device,
    load: MachineLoad,
    hardware: HardwareCeilings | None,
) -> Provenance:
    """The provenance block of a run's result, taken now."""
    return Provenance(
        git_sha=git_sha(),
        versions={
            "python": sys.version.split()[0],
            **{package: _version(package) for package in _VERSIONED_PACKAGES},
        },
        host=platform.node(),
        platform=platform.platform(),
        device=device,
        model=spec_dict["model"],
        dtype=spec_dict["dtype"],
        backend=spec_dict["backend"]["kind"],
        spec_hash=spec_hash,
        workload_hash=workload_hash,
        seed=spec_dict["seed"],
        machine_load=load,
        created_unix_s=time.time(),  # wall clock only as a label; durations use perf_counter
        hardware=hardware,
    )


def _busy_cpu_s() -> float | None:
    """CPU seconds all processes have spent busy since boot (/proc/stat; None off Linux)."""
    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    except OSError:
        return None
    user, nice, system, idle, iowait, irq, softirq = (int(v) for v in fields[:7])
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


def _self_cpu_s() -> float:
    """CPU seconds of this process and its waited-for children."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def _pid_cpu_s(pid: int) -> float | None:
    """CPU seconds of process `pid` and its children (None: it is gone or cannot be read)."""
    try:
        times = psutil.Process(pid).cpu_times()
    except psutil.Error:
        return None
    return times.user + times.system + times.children_user + times.children_system


@dataclass(frozen=True)
class LoadReadings:
    """Where `LoadMonitor` reads the machine; a test swaps in scripted readings, so that what
    it computes from them is checked without depending on how busy the test machine is."""

    busy_cpu_s: Callable[[], float | None] = _busy_cpu_s  # all processes, since boot
    self_cpu_s: Callable[[], float] = _self_cpu_s  # this process and its children
    pid_cpu_s: Callable[[int], float | None] = _pid_cpu_s  # another process (None: gone)
    loadavg_1m: Callable[[], float] = lambda: os.getloadavg()[0]
    clock: Callable[[], float] = time.perf_counter
    sleep: Callable[[float], None] = time.sleep
    cpu_count: int = os.cpu_count() or 1


# Other processes above this many cores, on average, flag a run (or a roof) as measured busy.
BUSY_OTHER_CORES = 0.25


def other_cores(busy_s: float, own_s: float, wall_s: float) -> float:
    """Cores other processes kept busy, on average, over `wall_s` seconds.

    Formula: max(0, busy_s − own_s) / wall_s, with busy_s the CPU seconds all processes spent
    busy in that time (/proc/stat) and own_s those of this process, its children and the
    `own_pids` (a server under test), rounded to 0.01.
    """
    return round(max(0.0, busy_s - own_s) / wall_s, 2)


class LoadMonitor:
    """How busy the machine was around a run: load average, and CPU used by *other* processes.

    On 2 cores a compile on the other core halves every number, so a run is flagged busy when
    other processes kept more than `BUSY_OTHER_CORES` of a core busy, on average, in the second
    before it started or during it (`other_cores`: all busy CPU time minus this process's own
    and that of `own_pids`: a server under test on this machine is the run's work, not noise).
    The 1-minute load average is kept too, but it lags: it stays high for a minute after the
    previous run ended. `readings` are the machine's (`LoadReadings`); a test passes its own.
    """

    def __init__(
        self,
        interval_s: float = 1.0,
        probe_s: float = 0.5,
        own_pids: tuple = (),
        readings: LoadReadings | None = None,
    ):
        self.own_pids = tuple(own_pids)
        self.readings = read = readings or LoadReadings()
        self.before = read.loadavg_1m()
        self.samples: list[float] = []
        self._interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._other_cores: float | None = None
        busy0, own0, t0 = read.busy_cpu_s(), self._own_cpu_s(), read.clock()
        read.sleep(probe_s)
        busy1, own1, t1 = read.busy_cpu_s(), self._own_cpu_s(), read.clock()
        self._other_before: float | None = None
        if busy0 is not None and busy1 is not None and t1 > t0:
            self._other_before = other_cores(busy1 - busy0, own1 - own0, t1 - t0)

    def __enter__(self) -> LoadMonitor:
        read = self.readings
        self._t0, self._busy0, self._own0 = read.clock(), read.busy_cpu_s(), self._own_cpu_s()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        read = self.readings
        busy1, own1, wall_s = read.busy_cpu_s(), self._own_cpu_s(), read.clock() - self._t0
        if busy1 is not None and self._busy0 is not None and wall_s > 0:
            self._other_cores = other_cores(busy1 - self._busy0, own1 - self._own0, wall_s)

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            self.samples.append(self.readings.loadavg_1m())

    def load(self) -> MachineLoad:
        """The load so far (inside the `with`, `other_processes_cores` is None: not over yet)."""
        other = self._other_cores
        return MachineLoad(
            cpu_count=self.readings.cpu_count,
            loadavg_1m_before=round(self.before, 2),
            loadavg_1m_max_during=round(max(self.samples, default=self.before), 2),
            other_processes_cores_before=self._other_before,
            other_processes_cores=other,  # mean cores busy with other work during the run
            is_busy=any(
                v is not None and v > BUSY_OTHER_CORES for v in (self._other_before, other)
            ),
            own_pids=self.own_pids,  # besides llmbench: a local server under test
        )

    def _own_cpu_s(self) -> float:
        """CPU seconds of this process, its children and `own_pids` (gone ones count 0)."""
        read = self.readings
        return read.self_cpu_s() + sum(read.pid_cpu_s(pid) or 0.0 for pid in self.own_pids)


def local_server_pids(*urls: str) -> list[int]:
    """The processes listening on the loopback ports the `urls` name: servers under test on
    this machine. [] for other hosts, or where the sockets cannot be read."""
    ports = set()
    for url in urls:
        parsed = urlparse(url)
        if parsed.hostname in ("127.0.0.1", "localhost", "::1"):
            ports.add(parsed.port or (443 if parsed.scheme == "https" else 80))
    if not ports:
        return []
    try:
        connections = psutil.net_connections(kind="tcp")
    except (psutil.Error, OSError):
        return []
    return sorted(
        {
            c.pid
            for c in connections
            if c.status == psutil.CONN_LISTEN and c.laddr.port in ports and c.pid
        }
    )
