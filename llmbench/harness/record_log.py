"""The run folder's record files, appended a line at a time as records complete, and read back.

`requests.jsonl` gets every `RequestRecord` when its request ends, `steps.jsonl` every engine
step (costed) when it ends, `sessions.jsonl` every session when its repetition ends. Every line
carries the `repetition` it belongs to (0: the warm-up; a record's own field, a step's from its
start time). One writer thread does
the writing, each batch in one unbuffered write per file, so the event loop and the engine thread
only put an object on a queue (about a microsecond), and a run killed even with `kill -9` leaves
every record that was written: at most the last few milliseconds' worth, and a cut last line, are
lost. A write that fails (a full disk) stops the run (`RecordLog.error`); the files keep whole
lines only.
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
from typing import Any, BinaryIO

from llmbench.errors import UserError
from llmbench.harness.records import RequestRecord, ServerTimings
from llmbench.harness.run_folder import WriteFailed, write_failed

REQUESTS_FILE = "requests.jsonl"
STEPS_FILE = "steps.jsonl"
SESSIONS_FILE = "sessions.jsonl"
_FILES = (REQUESTS_FILE, STEPS_FILE, SESSIONS_FILE)


class RecordLog:
    """Appends records to a run folder's jsonl files from any thread.

    `cost_step` turns an engine step into its steps.jsonl line (the roofline point); it runs on
    the writer thread, off the engine's. The files are truncated when the log opens and closed
    by `close()`, which writes what is queued.

    A write that fails (a full disk) keeps the file whole: a line written in part is cut off
    again, so each file holds whole lines only. That first failure is `error` (a `WriteFailed`,
    also handed to `on_error`, on the writer thread: the run stops); nothing more is written
    after it, and the lines that were not written are kept in `unwritten`, per file.
    """

    def __init__(
        self,
        folder: Path,
        cost_step: Callable[[Any], dict[str, Any]] | None = None,
        on_error: Callable[[WriteFailed], object] | None = None,
    ):
        self.folder = folder
        self._cost_step = cost_step
        self._on_error = on_error
        self._files: dict[str, BinaryIO] = {}
        for name in _FILES:
            try:
                self._files[name] = (folder / name).open("wb", buffering=0)
            except OSError as e:
                for f in self._files.values():
                    f.close()
                raise write_failed(folder / name, e) from None
        self._queue: queue.SimpleQueue[tuple[str, Any] | None] = queue.SimpleQueue()
        self.error: WriteFailed | None = None  # the first write that failed (a full disk)
        self._bad_record: str | None = None  # a record that could not be made a line
        self.num_written = dict.fromkeys(_FILES, 0)  # whole lines on disk, per file
        self.unwritten: dict[str, list[dict[str, Any]]] = {name: [] for name in _FILES}
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
        """Write everything queued and close the files; a write that failed is raised (the
        `WriteFailed`), then a record that could not be made a line (a `UserError`)."""
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join()
        for f in self._files.values():
            f.close()  # unbuffered: nothing is left to write
        if self.error is not None:
            raise self.error
        if self._bad_record is not None:
            raise UserError(f"{self.folder}: writing the records failed: {self._bad_record}")

    def _row(self, name: str, item: Any) -> dict[str, Any]:
        if isinstance(item, dict):
            return item
        if name == STEPS_FILE and self._cost_step is not None:
            row = self._cost_step(item)
            row["repetition"] = self.repetition_at(item.t_start_ns)
            return row
        return dataclasses.asdict(item)

    def _run(self) -> None:
        is_open = True
        while is_open:
            batch = [self._queue.get()]
            while True:  # everything that queued meanwhile goes out with one write per file
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            rows: dict[str, list[dict[str, Any]]] = {}
            for item in batch:
                if item is None:
                    is_open = False
                    continue
                name, record = item
                try:
                    rows.setdefault(name, []).append(self._row(name, record))
                except Exception as e:  # noqa: BLE001 — kept, and raised by close()
                    self._bad_record = self._bad_record or f"{name}: {type(e).__name__}: {e}"
            for name, file_rows in rows.items():
                self._append(name, file_rows)

    def _append(self, name: str, rows: list[dict[str, Any]]) -> None:
        """Write `rows` as whole lines at the end of file `name`; after a failed write, keep
        them (and every later one) in `unwritten`."""
        if self.error is not None:
            self.unwritten[name] += rows
            return
        lines = [(json.dumps(row) + "\n").encode() for row in rows]
        f = self._files[name]
        start = f.tell()
        try:
            _write(f, b"".join(lines))
        except OSError as e:
            # Cut what went out back to whole lines: a reader, and `llmbench report`, then see
            # exactly the records written, and the rest stay in memory for the summary.
            done, whole, size = f.tell() - start, 0, 0
            while whole < len(lines) and size + len(lines[whole]) <= done:
                size += len(lines[whole])
                whole += 1
            try:
                f.truncate(start + size)
                f.seek(start + size)
            except OSError:
                pass  # as it is: a reader drops a cut last line
            self.num_written[name] += whole
            self.unwritten[name] += rows[whole:]
            self.error = write_failed(self.folder / name, e)
            if self._on_error is not None:
                self._on_error(self.error)
            return
        self.num_written[name] += len(lines)


def _write(f: BinaryIO, data: bytes) -> None:
    """All of `data` to the unbuffered file `f` (the one place a record line is written: an
    OSError here, a full disk, is what `RecordLog` keeps the files whole through)."""
    view = memoryview(data)
    while view:
        view = view[f.write(view) :]


def rewrite_requests(folder: Path, records: Sequence[RequestRecord]) -> None:
    """Replace the folder's requests.jsonl with `records`, a line each as `RecordLog` writes
    them: for what is learnt about the requests once they ended (the server's timings from its
    log). Written aside, then renamed over the old file: a kill leaves one or the other whole;
    a write that fails is a `WriteFailed` and leaves the old file."""
    path = folder / REQUESTS_FILE
    aside = path.with_name(f"{REQUESTS_FILE}.new")
    try:
        with aside.open("w") as f:
            f.writelines(json.dumps(dataclasses.asdict(r)) + "\n" for r in records)
        os.replace(aside, path)
    except OSError as e:
        aside.unlink(missing_ok=True)
        raise write_failed(path, e) from None


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
