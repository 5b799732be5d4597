"""One step of a sitting as a child process: started in its own process group, killed (the whole
group) at its time box, its output kept for the sitting's log, and its end told in one
`StepOutcome` — whatever happens in the child, the sitting goes on to the next step."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

# At its time box a child is interrupted first (SIGINT: pytest writes its junit xml, `llmbench
# run` its results and report), then terminated, then killed, each after a grace period. The
# interrupt's grace comes out of the box, so a step that stops when asked ends within it.
INTERRUPT_GRACE_S = 10.0
KILL_GRACE_S = 5.0
LOG_TAIL_BYTES = 100_000  # of each step's output, kept in the sitting's log


@dataclass(frozen=True)
class StepOutcome:
    """How a step ended: `ok` (exit 0), `failed` (another exit), `timeout` (stopped at its box),
    `skipped` (not started: no time left), `interrupted` (the sitting was stopped)."""

    name: str
    status: str
    seconds: float
    exit_code: int | None = None
    error: str | None = None  # one line: the last line the child wrote, or why it was skipped

    @property
    def is_ok(self) -> bool:
        return self.status == "ok"


def run_step(
    name: str,
    command: Sequence[str],
    timeout_s: float,
    output_path: Path,
    env: Mapping[str, str],
    cwd: Path,
) -> StepOutcome:
    """Run `command` for at most `timeout_s` seconds, stdout and stderr into `output_path`."""
    t0 = time.monotonic()
    with output_path.open("wb") as out:
        try:
            process = subprocess.Popen(
                list(command),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=dict(env),
                cwd=cwd,
                start_new_session=True,  # its own group: a timeout kills what it started too
            )
        except OSError as error:
            return StepOutcome(name, "failed", time.monotonic() - t0, None, f"not started: {error}")
        grace_s = interrupt_grace_s(timeout_s)
        try:
            code = process.wait(timeout=max(timeout_s - grace_s, 0.1))
        except KeyboardInterrupt:  # the sitting itself is stopped: so is the step
            stop_group(process, ((signal.SIGINT, grace_s), *_TERMINATE))
            raise
        except subprocess.TimeoutExpired:
            stop_group(process, ((signal.SIGINT, grace_s), *_TERMINATE))
            seconds = time.monotonic() - t0
            return StepOutcome(
                name, "timeout", seconds, None, f"stopped at its {timeout_s:.0f} s time box"
            )
        stop_group(process, _TERMINATE)  # anything it left running in its group
    seconds = time.monotonic() - t0
    if code == 0:
        return StepOutcome(name, "ok", seconds, 0)
    return StepOutcome(name, "failed", seconds, code, last_line(output_path) or f"exit {code}")


def interrupt_grace_s(timeout_s: float) -> float:
    """How long before its box a step is interrupted: a child that watches its own time ends
    its work earlier (`engine_steps`).

    Formula: min(INTERRUPT_GRACE_S, timeout_s / 4).
    """
    return min(INTERRUPT_GRACE_S, timeout_s / 4)


_TERMINATE = ((signal.SIGTERM, KILL_GRACE_S), (signal.SIGKILL, KILL_GRACE_S))


def stop_group(process: subprocess.Popen, signals: Sequence[tuple[int, float]]) -> None:
    """Send each signal in turn to the child's process group until nothing of it is left,
    waiting up to its grace after each; the child is reaped."""
    for sig, grace_s in signals:
        process.poll()  # reap the child if it has ended: a zombie still counts in its group
        if not _group_alive(process.pid):
            break
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            break
        until = time.monotonic() + grace_s
        while time.monotonic() < until:
            process.poll()
            if not _group_alive(process.pid):
                break
            time.sleep(0.05)
    process.wait()


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def last_line(path: Path) -> str | None:
    """The last non-empty line of a step's output (a traceback's last line is its error)."""
    lines = [line.strip() for line in tail_text(path, 4096).splitlines() if line.strip()]
    return lines[-1][:300] if lines else None


def tail_text(path: Path, num_bytes: int = LOG_TAIL_BYTES) -> str:
    """The last `num_bytes` of a file, as text."""
    if not path.is_file():
        return ""
    with path.open("rb") as f:
        f.seek(max(0, path.stat().st_size - num_bytes))
        return f.read().decode("utf-8", errors="replace")
