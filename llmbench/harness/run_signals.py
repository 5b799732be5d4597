"""How a run stops early: SIGINT (Ctrl-C), SIGTERM (`timeout`, `docker stop`, CI cancellation)
and SIGHUP (a closed terminal) all end it the same way, and it exits 128 + the signal's number.

- During the workload (`attach`), the first signal cancels the drive: the driver keeps every
  request that ended and marks those in flight cancelled, and the run saves what it measured.
- Once the workload has ended (`drive_ended`) and while the run saves (`saving`), a first
  signal waits for the save to end.
- Anywhere else (loading the model, measuring roofs: nothing measured yet), and any signal after
  an earlier one (pressing Ctrl-C twice), raises `RunInterrupted` at once: the records already
  on disk stay, and `llmbench report` rebuilds the rest from them. A second signal while the run
  saves says what it skips (`RunInterrupted.skipped`: `second interrupt: skipping the reports;
  the records are in DIR, llmbench report DIR rebuilds them`).
- A write of the run that fails (a full disk, `fail`) stops the drive as a first signal does;
  the run then saves what it can and raises the `WriteFailed`.

`RunInterrupted` is a `KeyboardInterrupt`, so no `except Exception` on the way (a request's
error handling, say) can swallow it.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Any

from llmbench.harness.run_folder import WriteFailed

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class RunInterrupted(KeyboardInterrupt):
    """A signal ended the run; `exit_code` is the shell's 128 + signal number. `skipped`: what a
    second signal skipped of the saving, as the line to print (None: it skipped nothing)."""

    def __init__(self, signum: int, skipped: str | None = None):
        self.signum = signum
        self.skipped = skipped
        super().__init__(f"interrupted by {signal_name(signum)}")

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


def signal_name(signum: int) -> str:
    return signal.Signals(signum).name


class StopSignals:
    """While used as a context manager (main thread only), SIGINT, SIGTERM and SIGHUP stop the
    run as the module says; `signum` is the first one received."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.failed_write: WriteFailed | None = None  # the first write of the run that failed
        self._task: asyncio.Task[Any] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._is_saving = False
        self._saving_into: Path | None = None  # the folder `saving` saves
        self._left_to_save = ""  # what a second signal would skip of it
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for signum in SIGNALS:
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()

    def attach(self) -> None:
        """From now on a first signal cancels the current task (call it inside the drive)."""
        self._loop, self._task = asyncio.get_running_loop(), asyncio.current_task()

    def drive_ended(self) -> None:
        """The workload is over: from now on the run saves (a first signal waits for it)."""
        self._loop = self._task = None
        self._is_saving = True

    def fail(self, error: WriteFailed) -> None:
        """A write of the run failed (called from any thread): the first is `failed_write`, and
        the drive under way, if any, is cancelled as by a first signal."""
        if self.failed_write is None:
            self.failed_write = error
        loop, task = self._loop, self._task
        if loop is not None and task is not None:
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: drive over
                loop.call_soon_threadsafe(task.cancel)

    @contextlib.contextmanager
    def saving(self, folder: Path | None = None, left: str = "the reports") -> Iterator[None]:
        """A first signal waits for the block to end (`signum` tells it came); the saving
        mode `drive_ended` started ends with the block. A second signal in it raises
        `RunInterrupted` saying it skips `left` (`left_to_save` updates it) of `folder`."""
        self._is_saving = True
        self._saving_into, self._left_to_save = folder, left
        try:
            yield
        finally:
            self._is_saving = False
            self._saving_into = None

    def left_to_save(self, what: str) -> None:
        """What a second signal would now skip of the folder `saving` saves (`the reports`)."""
        self._left_to_save = what

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        is_first = self.signum is None
        if is_first:
            self.signum = signum
        if is_first and self._is_saving:
            return
        if is_first and self._task is not None and self._loop is not None:
            self._loop.call_soon_threadsafe(self._task.cancel)
            return
        raise RunInterrupted(signum, self._skipped_line())

    def _skipped_line(self) -> str | None:
        folder = self._saving_into
        if not self._is_saving or folder is None:
            return None
        return (
            f"second interrupt: skipping {self._left_to_save}; the records are in {folder}, "
            f"llmbench report {folder} rebuilds them"
        )
