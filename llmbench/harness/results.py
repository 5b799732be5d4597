"""The run folder: results.json (versioned schema), requests.jsonl, steps.jsonl.

Everything a report needs is in the folder, with the provenance that makes two runs comparable:
git sha, versions, device, model, dtype, spec hash, seed, and how busy the machine was.
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import subprocess
import sys
import threading
import time
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

import psutil

if TYPE_CHECKING:
    from llmbench.harness.telemetry import Telemetry

SCHEMA_VERSION = 1


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def git_sha() -> str | None:
    """The commit of the llmbench source in use (None outside a git checkout)."""
    here = Path(__file__).resolve().parent
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=5
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"],
        cwd=here,
        capture_output=True,
        text=True,
        timeout=5,
    ).stdout.strip()
    return out.stdout.strip() + ("-dirty" if dirty else "")


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _busy_cpu_s() -> float | None:
    """CPU seconds all processes have spent busy since boot (/proc/stat; None off Linux)."""
    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    except OSError:
        return None
    user, nice, system, idle, iowait, irq, softirq = (int(v) for v in fields[:7])
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


class LoadMonitor:
    """How busy the machine was around a run: load average, and CPU used by *other* processes.

    On 2 cores a compile on the other core halves every number (FIELD-NOTES), so a run is
    flagged busy when other processes kept more than a quarter of a core busy, on average, in
    the second before it started or during it (all busy CPU time minus this process's own and
    that of `own_pids`: a server under test on this machine is the run's work, not noise).
    The 1-minute load average is kept too, but it lags: it stays high for a minute after the
    previous run ended.
    """

    def __init__(self, interval_s: float = 1.0, probe_s: float = 0.5, own_pids: tuple = ()):
        self.own_pids = tuple(own_pids)
        self.before = os.getloadavg()[0]
        self.samples: list[float] = []
        self._interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._other_cpu_s: float | None = None
        self._wall_s = 0.0
        busy0, own0, t0 = _busy_cpu_s(), self._own_cpu_s(), time.perf_counter()
        time.sleep(probe_s)
        busy1 = _busy_cpu_s()
        self._other_before: float | None = None
        if busy0 is not None and busy1 is not None:
            other = max(0.0, (busy1 - busy0) - (self._own_cpu_s() - own0))
            self._other_before = round(other / (time.perf_counter() - t0), 2)

    def __enter__(self) -> LoadMonitor:
        self._t0 = time.perf_counter()
        self._busy0, self._own0 = _busy_cpu_s(), self._own_cpu_s()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._wall_s = time.perf_counter() - self._t0
        busy1 = _busy_cpu_s()
        if busy1 is not None and self._busy0 is not None:
            self._other_cpu_s = max(0.0, (busy1 - self._busy0) - (self._own_cpu_s() - self._own0))

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            self.samples.append(os.getloadavg()[0])

    def as_dict(self) -> dict[str, Any]:
        cores = os.cpu_count() or 1
        other = None
        if self._other_cpu_s is not None and self._wall_s > 0:
            other = round(self._other_cpu_s / self._wall_s, 2)
        return {
            "cpu_count": cores,
            "loadavg_1m_before": round(self.before, 2),
            "loadavg_1m_max_during": round(max(self.samples, default=self.before), 2),
            "other_processes_cores_before": self._other_before,
            "other_processes_cores": other,  # mean cores busy with other work during the run
            "is_busy": any(v is not None and v > 0.25 for v in (self._other_before, other)),
            "own_pids": list(self.own_pids),  # besides llmbench: a local server under test
        }

    def _own_cpu_s(self) -> float:
        """CPU seconds of this process, its children and `own_pids` (gone ones count 0)."""
        t = os.times()
        total = t.user + t.system + t.children_user + t.children_system
        for pid in self.own_pids:
            try:
                times = psutil.Process(pid).cpu_times()
            except psutil.Error:
                continue
            total += times.user + times.system + times.children_user + times.children_system
        return total


def local_server_pids(url: str) -> list[int]:
    """The processes listening on the loopback port `url` names: a server under test on this
    machine. [] for another host, or where the sockets cannot be read."""
    parsed = urlparse(url)
    if parsed.hostname not in ("127.0.0.1", "localhost", "::1"):
        return []
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    try:
        connections = psutil.net_connections(kind="tcp")
    except (psutil.Error, OSError):
        return []
    return sorted(
        {
            c.pid
            for c in connections
            if c.status == psutil.CONN_LISTEN and c.laddr.port == port and c.pid
        }
    )


def provenance(
    spec_dict: dict, spec_hash: str, workload_hash: str, device: dict, load: dict
) -> dict[str, Any]:
    return {
        "git_sha": git_sha(),
        "versions": {
            "llmbench": _version("llmbench"),
            "python": sys.version.split()[0],
            "torch": _version("torch"),
            "transformers": _version("transformers"),
            "aiohttp": _version("aiohttp"),
        },
        "host": platform.node(),
        "platform": platform.platform(),
        "device": device,
        "model": spec_dict["model"],
        "dtype": spec_dict["dtype"],
        "backend": spec_dict["backend"]["kind"],
        "spec_hash": spec_hash,
        "workload_hash": workload_hash,
        "seed": spec_dict["seed"],
        "machine_load": load,
        "created_unix_s": time.time(),  # wall clock only as a label; durations use perf_counter
    }


def write_run(
    out_dir: Path,
    results: dict[str, Any],
    records: list,
    steps: list[dict],
    sessions: list,
    telemetry: Telemetry | None = None,
) -> None:
    """Write the folder; results.json last and atomically, so a folder that has it is whole.

    `steps` are roofline points (`roofline.cost_steps` / `estimate_decode_steps`)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    if telemetry is not None:
        telemetry.write_csv(out_dir / "telemetry.csv")
    with (out_dir / "requests.jsonl").open("w") as f:
        for record in records:
            f.write(json.dumps(dataclasses.asdict(record)) + "\n")
    with (out_dir / "steps.jsonl").open("w") as f:
        for step in steps:
            f.write(json.dumps(step) + "\n")
    with (out_dir / "sessions.jsonl").open("w") as f:
        for session in sessions:
            f.write(json.dumps(dataclasses.asdict(session)) + "\n")
    tmp = out_dir / "results.json.tmp"
    tmp.write_text(json.dumps({"schema_version": SCHEMA_VERSION, **results}, indent=2))
    tmp.replace(out_dir / "results.json")


def session_summary(sessions: list) -> dict[str, Any]:
    """Job-level metrics: how long sessions took and where the time went."""
    done = [s for s in sessions if s.num_requests]
    if not done:
        return {"num_sessions": 0}

    def mean(values: list[float]) -> float:
        return sum(values) / len(values)

    prompt = sum(s.prompt_tokens for s in done)
    return {
        "num_sessions": len(done),
        "num_failed_sessions": sum(1 for s in done if s.num_failed),
        "mean_session_s": mean([(s.end_ns - s.start_ns) / 1e9 for s in done]),
        "mean_model_wait_s": mean([s.model_wait_ns / 1e9 for s in done]),
        "mean_tool_wait_s": mean([s.tool_wait_ns / 1e9 for s in done]),
        "mean_requests_per_session": mean([s.num_requests for s in done]),
        "prefix_cache_hit_rate": sum(s.cached_tokens for s in done) / prompt if prompt else None,
    }
