"""Provenance: the busy-machine flag, a local server under test, the collected block."""

from __future__ import annotations

import subprocess
import sys
import time

from llmbench.harness import provenance
from llmbench.harness.provenance import LoadMonitor, local_server_pids
from llmbench.harness.results import Device


def test_a_busy_other_process_flags_the_run():
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.5)
        with LoadMonitor() as monitor:
            time.sleep(1.0)
    finally:
        spinner.kill()
        spinner.wait()
    load = monitor.load()
    assert load.other_processes_cores > 0.5  # the spinner keeps one core busy
    assert load.other_processes_cores_before > 0.5
    assert load.is_busy is True


def test_inside_the_run_only_the_before_part_is_known():
    with LoadMonitor(probe_s=0.1) as monitor:
        load = monitor.load()
    assert load.other_processes_cores is None  # the run is not over
    assert load.other_processes_cores_before is not None
    assert monitor.load().other_processes_cores is not None


def test_a_local_server_under_test_is_not_counted_as_other_load():
    """The same spinning process, counted as other load and then as the run's own server."""
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)
        loads = []
        for own_pids in ((), (spinner.pid,)):
            with LoadMonitor(own_pids=own_pids) as monitor:
                time.sleep(1.0)
            loads.append(monitor.load())
    finally:
        spinner.kill()
        spinner.wait()
    counted, excluded = loads
    assert excluded.own_pids == (spinner.pid,)
    # The spinner keeps a core busy: excluding it takes (about) a core off "other".
    assert excluded.other_processes_cores < counted.other_processes_cores - 0.5
    assert excluded.other_processes_cores_before < counted.other_processes_cores_before - 0.5


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
