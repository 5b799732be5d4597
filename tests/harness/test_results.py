"""Run-folder helpers: the busy-machine flag and the session summary."""

from __future__ import annotations

import subprocess
import sys
import time

from llmbench.harness.driver import SessionStats
from llmbench.harness.results import LoadMonitor, local_server_pids, session_summary


def test_a_busy_other_process_flags_the_run():
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.5)
        with LoadMonitor() as monitor:
            time.sleep(1.0)
    finally:
        spinner.kill()
        spinner.wait()
    load = monitor.as_dict()
    assert load["other_processes_cores"] > 0.5  # the spinner keeps one core busy
    assert load["other_processes_cores_before"] > 0.5
    assert load["is_busy"] is True


def test_a_local_server_under_test_is_not_counted_as_other_load():
    """The same spinning process, counted as other load and then as the run's own server."""
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)
        loads = []
        for own_pids in ((), (spinner.pid,)):
            with LoadMonitor(own_pids=own_pids) as monitor:
                time.sleep(1.0)
            loads.append(monitor.as_dict())
    finally:
        spinner.kill()
        spinner.wait()
    counted, excluded = loads
    assert excluded["own_pids"] == [spinner.pid]
    # The spinner keeps a core busy: excluding it takes (about) a core off "other".
    assert excluded["other_processes_cores"] < counted["other_processes_cores"] - 0.5
    assert excluded["other_processes_cores_before"] < counted["other_processes_cores_before"] - 0.5


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


def test_session_summary_by_hand():
    sessions = [
        SessionStats(
            "a",
            start_ns=0,
            end_ns=4_000_000_000,
            model_wait_ns=3_000_000_000,
            tool_wait_ns=1_000_000_000,
            num_requests=3,
            prompt_tokens=300,
            cached_tokens=200,
        ),
        SessionStats(
            "b",
            start_ns=0,
            end_ns=2_000_000_000,
            model_wait_ns=2_000_000_000,
            num_requests=1,
            num_failed=1,
            prompt_tokens=100,
            cached_tokens=0,
        ),
    ]
    summary = session_summary(sessions)
    assert summary == {
        "num_sessions": 2,
        "num_failed_sessions": 1,
        "mean_session_s": 3.0,
        "mean_model_wait_s": 2.5,
        "mean_tool_wait_s": 0.5,
        "mean_requests_per_session": 2.0,
        "prefix_cache_hit_rate": 0.5,  # (200 + 0) / (300 + 100)
    }
