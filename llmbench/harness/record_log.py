"""The run folder's record files, appended a line at a time as records complete, and read back.

`requests.jsonl` gets every `RequestRecord` when its request ends, `steps.jsonl` every engine
step (costed) when it ends, `sessions.jsonl` every session when its repetition ends. Every line
carries the `repetition` it belongs to (0: the warm-up; a record's own field, a step's from its
start time). One writer thread does
the writing and flushes after each batch, so the event loop and the engine thread only put an
object on a queue (about a microsecond), and a run killed even with `kill -9` leaves every record
that was written: at most the last few milliseconds' worth, and a cut last line, are lost.
"""

from __future__ import annotations

import bisect
import dataclasses
import json
import os
import queue
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any

from llmbench.errors import UserError
from llmbench.harness.records import RequestRecord, ServerTimings

REQUESTS_FILE = "requests.jsonl"
STEPS_FILE = "steps.jsonl"
SESSIONS_FILE = "sessions.jsonl"
_FILES = (REQUESTS_FILE, STEPS_FILE, SESSIONS_FILE)


class RecordLog:
    """Appends records to a run folder's jsonl files from any thread.

    `cost_step` turns an engine step into its steps.jsonl line (the roofline point); it runs on
    the writer thread, off the engine's. The files are truncated when the log opens (a folder
    reused with `--out` starts over) and closed by `close()`, which writes what is queued.
    """

    def __init__(self, folder: Path, cost_step: Callable[[Any], dict[str, Any]] | None = None):
        self.folder = folder
        self._cost_step = cost_step
        self._files: dict[str, IO[str]] = {name: (folder / name).open("w") for name in _FILES}
        self._queue: queue.SimpleQueue[tuple[str, Any] | None] = queue.SimpleQueue()
        self.error: str | None = None  # the first write that failed (a full disk)
        # perf_counter_ns at which repetition 1, 2, ... started; replaced whole, never mutated,
        # as the writer thread reads it
        self._repetition_starts_ns: tuple[int, ...] = ()
        self._thread = threading.Thread(target=self._run, name="llmbench-records", daemon=True)
        self._thread.start()

    def start_repetition(self, number: int, t_ns: int) -> None:
        """Repetition `number` (1, 2, ... in order) starts at `t_ns`: the engine steps that start
        from then on are its own, those before belong to the one before (0: the warm-up)."""
        if number != len(self._repetition_starts_ns) + 1:
            raise ValueError(f"repetition {number} after {len(self._repetition_starts_ns)}")
        self._repetition_starts_ns = (*self._repetition_starts_ns, t_ns)

    def repetition_at(self, t_ns: int) -> int:
        """The repetition under way at `t_ns`: the last one started at or before it."""
        return bisect.bisect_right(self._repetition_starts_ns, t_ns)

    def request(self, record: RequestRecord) -> None:
        """A request that ended (it is not changed after this)."""
        self._queue.put((REQUESTS_FILE, record))

    def step(self, step: Any) -> None:
        """An engine `StepRecord` (called on the engine thread); written costed, with the
        repetition under way when it started."""
        self._queue.put((STEPS_FILE, step))

    def session(self, stats: Any) -> None:
        """A session's `SessionStats` once it ended."""
        self._queue.put((SESSIONS_FILE, stats))

    def point(self, point: dict[str, Any]) -> None:
        """A roofline point already made (the openai backend's estimated decode windows), its
        `repetition` included."""
        self._queue.put((STEPS_FILE, point))

    def close(self) -> None:
        """Write everything queued and close the files; a failed write is a `UserError`."""
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join()
        for f in self._files.values():
            f.close()
        if self.error is not None:
            raise UserError(f"{self.folder}: writing the records failed: {self.error}")

    def _line(self, name: str, item: Any) -> str:
        if isinstance(item, dict):
            row = item
        elif name == STEPS_FILE and self._cost_step is not None:
            row = self._cost_step(item)
            row["repetition"] = self.repetition_at(item.t_start_ns)
        else:
            row = dataclasses.asdict(item)
        return json.dumps(row) + "\n"

    def _run(self) -> None:
        is_open = True
        while is_open:
            batch = [self._queue.get()]
            while True:  # everything that queued meanwhile goes out with one flush per file
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            touched = set()
            for item in batch:
                if item is None:
                    is_open = False
                    continue
                name, record = item
                try:
                    self._files[name].write(self._line(name, record))
                except Exception as e:  # noqa: BLE001 — kept, and raised by close()
                    self.error = self.error or f"{name}: {type(e).__name__}: {e}"
                touched.add(name)
            for name in touched:
                try:
                    self._files[name].flush()
                except OSError as e:
                    self.error = self.error or f"{name}: {e}"


def rewrite_requests(folder: Path, records: Sequence[RequestRecord]) -> None:
    """Replace the folder's requests.jsonl with `records`, a line each as `RecordLog` writes
    them: for what is learnt about the requests once they ended (the server's timings from its
    log). Written aside, then renamed over the old file: a kill leaves one or the other whole."""
    path = folder / REQUESTS_FILE
    aside = path.with_name(f"{REQUESTS_FILE}.new")
    try:
        with aside.open("w") as f:
            f.writelines(json.dumps(dataclasses.asdict(r)) + "\n" for r in records)
        os.replace(aside, path)
    except OSError as e:
        raise UserError(f"{folder}: writing the records failed: {e}") from None


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The lines of a jsonl file ([] when absent). A last line without its newline was cut by a
    kill mid-write and is dropped; any other bad line is a `UserError` naming file and line."""
    if not path.is_file():
        return []
    text = path.read_text()
    lines = text.splitlines()
    if lines and not text.endswith("\n"):
        lines.pop()
    rows = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as e:
            raise UserError(f"{path}:{number}: not valid JSON ({e.msg})") from None
    return rows


_RECORD_FIELDS = {f.name for f in dataclasses.fields(RequestRecord)}
_TIMINGS_FIELDS = {f.name for f in dataclasses.fields(ServerTimings)}


def read_requests(folder: Path) -> list[RequestRecord]:
    """Every request of the folder's requests.jsonl, warm-up included (`is_warmup`). A field a
    line does not have (written by an older llmbench) takes its default; one llmbench no longer
    knows is left out."""
    return [request_record(row) for row in read_jsonl(folder / REQUESTS_FILE)]


def request_record(row: dict[str, Any]) -> RequestRecord:
    """A requests.jsonl line back as the `RequestRecord` it was written from."""
    fields = {k: v for k, v in row.items() if k in _RECORD_FIELDS}
    timings = fields.get("server_timings")
    if isinstance(timings, dict):
        known = {k: v for k, v in timings.items() if k in _TIMINGS_FIELDS}
        fields["server_timings"] = ServerTimings(**{"source": "", **known})
    return RequestRecord(**fields)


def read_steps(folder: Path) -> list[dict[str, Any]]:
    """The roofline points of steps.jsonl, each with its `repetition` (1 for a line written
    before repetitions were recorded: results schema 2 and older)."""
    return [{"repetition": 1, **row} for row in read_jsonl(folder / STEPS_FILE)]


def read_sessions(folder: Path) -> list[dict[str, Any]]:
    """The sessions of sessions.jsonl (those that ended), each with its `repetition` (1 for a
    line written before repetitions were recorded)."""
    return [{"repetition": 1, **row} for row in read_jsonl(folder / SESSIONS_FILE)]
