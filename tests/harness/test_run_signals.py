"""How a run stops early: signals delivered to this process (`os.kill` of our own pid: Python
runs the handler in the main thread before the next line), and a failed write."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from llmbench.harness.run_folder import WriteFailed
from llmbench.harness.run_signals import RunInterrupted, StopSignals
from tests.harness.test_run import NO_HANG_S, SMALL, TINY


def interrupt() -> None:
    """Ctrl-C, as the terminal sends it."""
    os.kill(os.getpid(), signal.SIGINT)


def test_a_second_interrupt_while_saving_says_what_it_skips(tmp_path):
    """The first Ctrl-C while the run saves waits for the save; the second stops it at once
    and says what it skips, where the records are and how to get the rest back (before: it
    skipped the reports and said nothing), with the first signal's exit code."""
    with StopSignals() as stop:
        stop.drive_ended()
        with (
            pytest.raises(RunInterrupted) as second,
            stop.saving(tmp_path, "results.json and the reports"),
        ):
            interrupt()  # the first: the save goes on
            assert stop.signum == signal.SIGINT
            stop.left_to_save("the reports")  # results.json is written
            interrupt()
    assert second.value.skipped == (
        f"second interrupt: skipping the reports; the records are in {tmp_path}, "
        f"llmbench report {tmp_path} rebuilds them"
    )
    assert second.value.exit_code == 130 and str(second.value) == "interrupted by SIGINT"


def test_a_second_interrupt_outside_a_save_skips_nothing_it_names():
    """Before the workload a first signal stops the run at once: nothing to skip, no line."""
    with StopSignals(), pytest.raises(RunInterrupted) as first:
        interrupt()
    assert first.value.skipped is None and first.value.exit_code == 130


def test_a_failed_write_cancels_the_drive_from_another_thread(tmp_path):
    """The record writer's thread reports a full disk: the drive under way is cancelled as by
    a first signal, and the first failure is the one kept."""
    first = WriteFailed(tmp_path / "steps.jsonl", "No space left on device", 0, "free some space")
    later = WriteFailed(
        tmp_path / "requests.jsonl", "No space left on device", 0, "free some space"
    )

    async def drive(stop: StopSignals) -> None:
        stop.attach()
        writer = threading.Thread(target=lambda: (stop.fail(first), stop.fail(later)))
        writer.start()
        await asyncio.sleep(NO_HANG_S)

    with StopSignals() as stop, pytest.raises(asyncio.CancelledError):
        asyncio.run(drive(stop))
    assert stop.failed_write is first and stop.signum is None


# The second Ctrl-C comes from outside: this wrapper makes the reports send SIGINT twice to the
# run (as a user pressing Ctrl-C twice while it saves), then runs the real CLI.
TWICE = """
import os, signal, sys
from llmbench.reports import render
def impatient(folder):
    os.kill(os.getpid(), signal.SIGINT)
    os.kill(os.getpid(), signal.SIGINT)
render.write_reports = impatient
from llmbench.cli.main import main
sys.argv = ["llmbench", *sys.argv[1:]]
main()
"""


def test_ctrl_c_twice_while_saving_says_so_and_exits_130(tmp_path):
    out = tmp_path / "run"
    result = subprocess.run(
        [sys.executable, "-c", TWICE, "run", "rag", *TINY, *SMALL["rag"], "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=NO_HANG_S,
    )
    assert result.returncode == 130, result.stderr
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-2:] == [
        f"second interrupt: skipping the reports; the records are in {out}, llmbench report "
        f"{out} rebuilds them",
        "interrupted by SIGINT",
    ]
    assert json.loads((out / "results.json").read_text())["interrupted"] is False  # it ended
    assert not (out / "report.html").exists()
    rebuilt = subprocess.run(
        [sys.executable, "-m", "llmbench", "report", str(out)], capture_output=True, text=True
    )
    assert rebuilt.returncode == 0, rebuilt.stderr
    assert Path(rebuilt.stdout.splitlines()[0]) == out / "report.html"
