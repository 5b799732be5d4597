"""`llmbench serve --record DIR`: every engine step, as a JSON line, to DIR/steps.jsonl while
serving, written by a thread of its own so the engine never waits on the disk.

The engine thread only puts each `StepRecord` on a bounded queue (a few microseconds). A writer
thread turns them into lines, writes them in batches and flushes whenever the queue runs dry,
so `tail -f` sees a step within milliseconds. Steps that do not reach the file are counted as
dropped (`num_dropped`, also `llmbench_record_dropped_steps_total` in /metrics), never waited
for:
- a disk `MAX_PENDING_STEPS` steps behind: later steps are dropped instead of queued (memory
  stays bounded);
- a write that fails (no space left, an I/O error): said once on stderr; the file is given up
  and every later step is dropped, while serving goes on;
- a disk that has not taken the queued steps `CLOSE_TIMEOUT_S` after shutdown begins: `close`
  stops waiting (the writer is a daemon thread), so a signal still ends the server at once.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import queue
import sys
import threading
import time
from pathlib import Path
from typing import Any

from llmbench.errors import UserError

MAX_PENDING_STEPS = 20_000  # at most ≈ 10 MB of StepRecords waiting for the disk
MAX_BATCH_STEPS = 1_000  # lines per write + flush while the queue stays busy
CLOSE_TIMEOUT_S = 1.0  # at shutdown, the disk gets this long to take what is queued
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
        self.num_steps = 0  # every step the engine handed over (engine thread)
        self.num_queue_full = 0  # dropped: the queue was full (engine thread)
        self.num_written = 0  # flushed to the file (writer thread)
        self.num_failed = 0  # dropped: the write failed, or came after one that did (writer)
        self.write_error: OSError | None = None  # the first failed write
        self._num_abandoned = 0  # still queued when close() stopped waiting
        self._thread = threading.Thread(target=self._write, name="llmbench-record", daemon=True)
        self._thread.start()

    @property
    def num_dropped(self) -> int:
        """Steps that will never be in the file: queue full, failed writes, left at shutdown."""
        return self.num_queue_full + self.num_failed + self._num_abandoned

    def on_step(self, record: Any) -> None:
        """The engine's `on_step` hook (on the engine thread): never blocks."""
        self.num_steps += 1
        try:
            self._pending.put_nowait(record)
        except queue.Full:
            self.num_queue_full += 1

    def close(self) -> None:
        """Write what is queued, then close the file, waiting at most `CLOSE_TIMEOUT_S` in all
        (the engine must no longer call `on_step`)."""
        deadline = time.monotonic() + CLOSE_TIMEOUT_S
        with contextlib.suppress(queue.Full):  # a stalled writer frees no slot for the marker
            self._pending.put(_STOP, timeout=CLOSE_TIMEOUT_S)
        self._thread.join(max(0.0, deadline - time.monotonic()))
        reasons = []
        if self._thread.is_alive():  # stuck in a write: it is a daemon, leave it the file
            self._num_abandoned = self.num_steps - self.num_written - self.num_queue_full
            self._num_abandoned -= self.num_failed
            reasons.append(f"the disk had not taken them {CLOSE_TIMEOUT_S:g} s after shutdown")
        if self.num_queue_full:
            reasons.append(f"the disk fell {MAX_PENDING_STEPS} steps behind")
        if self.write_error is not None:
            reasons.append(f"writing failed: {_describe(self.write_error)}")
        if self.num_dropped:
            self._say(
                f"llmbench serve: --record dropped {self.num_dropped} steps "
                f"({'; '.join(reasons)}); {self.num_written} are in {self.path}"
            )

    def _write(self) -> None:
        """The writer thread: batches of lines, a flush when the queue runs dry."""
        is_stopping = False
        while not is_stopping:
            batch = [self._pending.get()]
            while len(batch) < MAX_BATCH_STEPS and not self._pending.empty():
                batch.append(self._pending.get_nowait())  # only this thread takes: no Empty
            if batch[-1] is _STOP:
                is_stopping = True
                batch.pop()
            if self.write_error is not None:
                self.num_failed += len(batch)
                continue
            try:
                self._file.write("".join(json.dumps(dataclasses.asdict(r)) + "\n" for r in batch))
                self._file.flush()
            except OSError as e:
                self._give_up(e, len(batch))
            else:
                self.num_written += len(batch)
        with contextlib.suppress(OSError):  # after a failed write the flush fails again
            self._file.close()

    def _give_up(self, error: OSError, num_lost: int) -> None:
        # The file's buffer state after a failed write is unknown (a partial line, bytes that
        # a later flush would repeat), so nothing more is written to it.
        self.write_error = error
        self.num_failed += num_lost
        self._say(
            f"llmbench serve: --record cannot write {self.path}: {_describe(error)}; steps are no "
            "longer recorded (counted in llmbench_record_dropped_steps_total), serving goes on"
        )

    def _say(self, line: str) -> None:
        print(line, file=sys.stderr, flush=True)


def _describe(error: OSError) -> str:
    return error.strerror or str(error) or type(error).__name__
