"""How a run stops early: SIGINT (Ctrl-C), SIGTERM (`timeout`, `docker stop`, CI cancellation)
and SIGHUP (a closed terminal) all end it the same way, and it exits 128 + the signal's number.

- During the workload (`attach`), the first signal cancels the drive: the driver keeps every
  request that ended and marks those in flight cancelled, and the run saves what it measured.
- Once the workload has ended (`drive_ended`) and while the run saves (`saving`), a first
  signal waits for the save to end.
- Anywhere else (loading the model, measuring roofs: nothing measured yet), and any signal after
  an earlier one (pressing Ctrl-C twice), raises `RunInterrupted` at once: the records already
  on disk stay, and `llmbench report` rebuilds the rest from them.

`RunInterrupted` is a `KeyboardInterrupt`, so no `except Exception` on the way (a request's
error handling, say) can swallow it.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType
from typing import Any

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class RunInterrupted(KeyboardInterrupt):
    """A signal ended the run; `exit_code` is the shell's 128 + signal number."""

    def __init__(self, signum: int):
        self.signum = signum
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
        self._task: asyncio.Task[Any] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._is_saving = False
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

    @contextlib.contextmanager
    def saving(self) -> Iterator[None]:
        """A first signal waits for the block to end (`signum` tells it came); the saving
        mode `drive_ended` started ends with the block."""
        self._is_saving = True
        try:
            yield
        finally:
            self._is_saving = False

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        is_first = self.signum is None
        if is_first:
            self.signum = signum
        if is_first and self._is_saving:
            return
        if is_first and self._task is not None and self._loop is not None:
            self._loop.call_soon_threadsafe(self._task.cancel)
            return
        raise RunInterrupted(signum)
