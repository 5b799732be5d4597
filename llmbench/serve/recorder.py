"""`llmbench serve --record DIR`: every engine step, as a JSON line, to DIR/steps.jsonl while
serving, written by a thread of its own so the engine never waits on the disk.

The engine thread only puts each `StepRecord` on a bounded queue (a few microseconds). A writer
thread turns them into lines and flushes whenever the queue runs dry, so `tail -f` sees a step
within milliseconds. If the disk falls `MAX_PENDING_STEPS` steps behind, later steps are counted
as dropped instead of queued (memory stays bounded) and the count is printed at shutdown.
"""

from __future__ import annotations

import dataclasses
import json
import queue
import sys
import threading
from pathlib import Path
from typing import Any

from llmbench.errors import UserError

MAX_PENDING_STEPS = 20_000  # at most ≈ 10 MB of StepRecords waiting for the disk
_STOP = object()


class StepRecorder:
    def __init__(self, folder: Path) -> None:
        """Create `folder` and open `steps.jsonl` in it (appending): a bad folder is a one-line
        `UserError` before the server starts."""
        self.path = folder / "steps.jsonl"
        try:
            folder.mkdir(parents=True, exist_ok=True)
            self._file = self.path.open("a", encoding="utf-8")
        except OSError as e:
            raise UserError(
                f"serve --record: cannot write {self.path}: {e.strerror or e}; give a folder "
                "you can write to"
            ) from e
        self._pending: queue.Queue[Any] = queue.Queue(maxsize=MAX_PENDING_STEPS)
        self.num_dropped = 0
        self.num_written = 0
        self._thread = threading.Thread(target=self._write, name="llmbench-record", daemon=True)
        self._thread.start()

    def on_step(self, record: Any) -> None:
        """The engine's `on_step` hook (on the engine thread): never blocks."""
        try:
            self._pending.put_nowait(record)
        except queue.Full:
            self.num_dropped += 1

    def close(self) -> None:
        """Write what is queued, then close the file."""
        self._pending.put(_STOP)
        self._thread.join()
        self._file.close()
        if self.num_dropped:
            print(
                f"llmbench serve: --record dropped {self.num_dropped} steps (the disk fell "
                f"{MAX_PENDING_STEPS} steps behind); {self.num_written} are in {self.path}",
                file=sys.stderr,
            )

    def _write(self) -> None:
        while True:
            record = self._pending.get()
            if record is _STOP:
                self._file.flush()
                return
            self._file.write(json.dumps(dataclasses.asdict(record)) + "\n")
            self.num_written += 1
            if self._pending.empty():
                self._file.flush()
