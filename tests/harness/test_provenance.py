"""Provenance: the busy-machine flag, a local server under test, the collected block. The load
figures are computed from scripted CPU readings (`Machine`), never from how busy the machine
running the tests happens to be."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from llmbench.harness import provenance
from llmbench.harness.provenance import LoadMonitor, local_server_pids
from llmbench.harness.results import Device


class Machine:
    """A machine whose CPU counters advance only when the test says: `others`, `self_` and each
    pid's cores busy per second of `advance` (or of the monitor's probe sleep)."""

    def __init__(self, others: float, self_: float = 0.0, pids: dict | None = None):
        self.others, self.self_, self.pids = others, self_, dict(pids or {})
        self.t = self.busy = self.own = 0.0
        self.pid_s = dict.fromkeys(self.pids, 0.0)

    def advance(self, seconds: float) -> None:
        self.t += seconds
        self.busy += (self.others + self.self_ + sum(self.pids.values())) * seconds
        self.own += self.self_ * seconds
        for pid, cores in self.pids.items():
            self.pid_s[pid] += cores * seconds

    def readings(self) -> provenance.LoadReadings:
        return provenance.LoadReadings(
            busy_cpu_s=lambda: self.busy,
            self_cpu_s=lambda: self.own,
            pid_cpu_s=self.pid_s.get,  # a pid it does not know is gone: None
            loadavg_1m=lambda: 1.5,
            clock=lambda: self.t,
            sleep=self.advance,
            cpu_count=2,
        )


def test_a_busy_other_process_flags_the_run():
    """Another process keeping 0.75 of a core busy, beside the run's own half core: 0.75 cores
    of other load before (the 0.5 s probe) and during (2 s) the run."""
    machine = Machine(others=0.75, self_=0.5)
    with LoadMonitor(readings=machine.readings()) as monitor:
        machine.advance(2.0)
    load = monitor.load()
    assert (load.other_processes_cores_before, load.other_processes_cores) == (0.75, 0.75)
    assert load.is_busy is True
    assert (load.cpu_count, load.loadavg_1m_before) == (2, 1.5)


def test_a_quarter_core_of_other_work_is_not_busy():
    assert LoadMonitor(readings=Machine(others=0.25).readings()).load().is_busy is False
    assert LoadMonitor(readings=Machine(others=0.5).readings()).load().is_busy is True


def test_other_cores_is_all_busy_time_but_the_runs_own():
    # 3.0 CPU s busy in 2 s, 1.2 of them the run's: 0.9 cores of other work; never below 0.
    assert provenance.other_cores(3.0, 1.2, 2.0) == 0.9
    assert provenance.other_cores(1.0, 1.5, 2.0) == 0.0


def test_inside_the_run_only_the_before_part_is_known():
    with LoadMonitor(probe_s=0.1) as monitor:
        load = monitor.load()
    assert load.other_processes_cores is None  # the run is not over
    assert load.other_processes_cores_before is not None
    assert monitor.load().other_processes_cores is not None


def test_a_local_server_under_test_is_not_counted_as_other_load():
    """The same server process (pid 4242, one core busy), counted as other load and then as the
    run's own server: excluding it takes exactly its core off "other"."""
    loads = []
    for own_pids in ((), (4242,)):
        machine = Machine(others=0.25, self_=0.5, pids={4242: 1.0})
        with LoadMonitor(own_pids=own_pids, readings=machine.readings()) as monitor:
            machine.advance(2.0)
        loads.append(monitor.load())
    counted, excluded = loads
    assert excluded.own_pids == (4242,)
    assert (counted.other_processes_cores_before, counted.other_processes_cores) == (1.25, 1.25)
    assert (excluded.other_processes_cores_before, excluded.other_processes_cores) == (0.25, 0.25)
    assert (counted.is_busy, excluded.is_busy) == (True, False)


def test_a_server_that_is_gone_counts_no_cpu():
    machine = Machine(others=0.0, self_=1.0)
    with LoadMonitor(own_pids=(99,), readings=machine.readings()) as monitor:
        machine.advance(1.0)
    assert monitor.load().other_processes_cores == 0.0


def test_process_cpu_is_read_from_the_process_and_none_when_it_is_gone():
    assert provenance._pid_cpu_s(os.getpid()) > 0  # this process has run its imports
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    assert provenance._pid_cpu_s(gone.pid) is None


def test_local_server_pids_finds_the_listener_on_loopback_only():
    code = (
        "import socket, sys, time; s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(); "
        "print(s.getsockname()[1], flush=True); time.sleep(30)"
    )
    server = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        port = int(server.stdout.readline())
        assert local_server_pids(f"http://127.0.0.1:{port}/v1") == [server.pid]
        assert local_server_pids(f"http://localhost:{port}") == [server.pid]
        assert local_server_pids(f"http://10.1.2.3:{port}/v1") == []  # not this machine
        # Several endpoints (backend.urls): the listeners of each, once.
        both = (f"http://10.1.2.3:{port}/v1", f"http://127.0.0.1:{port}/v1")
        assert local_server_pids(*both, f"http://localhost:{port}") == [server.pid]
        assert local_server_pids() == []
    finally:
        server.kill()
        server.wait()


def test_collect_takes_the_spec_fields_and_this_machine():
    with LoadMonitor(probe_s=0.05) as monitor:
        pass
    spec = {"model": "synthetic:tiny", "dtype": "float32", "seed": 7, "backend": {"kind": "engine"}}
    device = Device("remote", url="http://x/v1")
    block = provenance.collect(spec, "s-hash", "w-hash", device, monitor.load(), None)
    assert (block.model, block.dtype, block.seed, block.backend) == (
        "synthetic:tiny",
        "float32",
        7,
        "engine",
    )
    assert (block.spec_hash, block.workload_hash, block.device) == ("s-hash", "w-hash", device)
    assert block.versions["python"] == sys.version.split()[0]
    assert block.versions["torch"].startswith("2.")
    assert block.hardware is None
    assert block.git_sha is None or len(block.git_sha.removesuffix("-dirty")) == 40


def test_git_sha_of_a_build_is_the_commit_git_archive_wrote(tmp_path, monkeypatch):
    """A build of a git ref (`llmbench ab`) is no checkout: `git archive` expanded COMMIT."""
    archived = tmp_path / "COMMIT"
    archived.write_text("0123456789abcdef0123456789abcdef01234567\n")
    monkeypatch.setattr(provenance, "ARCHIVED_COMMIT", archived)
    assert provenance.git_sha() == "0123456789abcdef0123456789abcdef01234567"
    archived.write_text("$Format:%H$\n")  # a checkout: not expanded, so git says
    head = subprocess.run(
        ["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=Path(__file__).parent
    ).stdout.strip()
    assert provenance.git_sha().removesuffix("-dirty") == head
