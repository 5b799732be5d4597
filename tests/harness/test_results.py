"""Run-folder helpers: the busy-machine flag and the session summary."""

from __future__ import annotations

import subprocess
import sys
import time

from llmbench.harness.driver import SessionStats
from llmbench.harness.results import LoadMonitor, session_summary


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
