"""The record files: every line on disk as soon as its record ends, readable after a kill."""

from __future__ import annotations

import errno
import json
import shutil
import threading
import time
from types import SimpleNamespace

import pytest

from llmbench.errors import UserError
from llmbench.harness import record_log
from llmbench.harness.driver import SessionStats
from llmbench.harness.record_log import RecordLog
from llmbench.harness.records import RequestRecord, ServerTimings
from llmbench.harness.run_folder import WriteFailed


def a_record(i: int) -> RequestRecord:
    return RequestRecord(f"s{i}-t0", f"s{i}", 0, scheduled_ns=i, sent_ns=i + 1, end_ns=i + 9)


def lines_within(path, count: int, timeout_s: float = 5.0) -> list[str]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        lines = path.read_text().splitlines()
        if len(lines) >= count:
            return lines
        time.sleep(0.01)
    return path.read_text().splitlines()


def test_records_reach_the_disk_before_the_log_closes(tmp_path):
    log = RecordLog(tmp_path, cost_step=lambda step: {"costed": step.t_start_ns})
    log.request(a_record(1))
    log.step(SimpleNamespace(t_start_ns=7))  # an engine StepRecord in a run
    lines = lines_within(tmp_path / "requests.jsonl", 1)
    assert json.loads(lines[0])["request_id"] == "s1-t0"  # flushed while the run goes on
    assert lines_within(tmp_path / "steps.jsonl", 1) == ['{"costed": 7, "repetition": 0}']
    log.request(a_record(2))
    log.session(SessionStats("s1", num_requests=1))
    log.point({"phase": "decode", "repetition": 2})
    log.close()
    assert [r.request_id for r in record_log.read_requests(tmp_path)] == ["s1-t0", "s2-t0"]
    assert record_log.read_steps(tmp_path) == [
        {"costed": 7, "repetition": 0},
        {"phase": "decode", "repetition": 2},
    ]
    assert record_log.read_sessions(tmp_path)[0]["session_id"] == "s1"


def test_a_step_belongs_to_the_repetition_under_way_when_it_started(tmp_path):
    log = RecordLog(tmp_path, cost_step=lambda step: {"t": step.t_start_ns})
    log.start_repetition(1, 100)
    log.start_repetition(2, 200)
    for t in (50, 100, 199, 200, 350):  # a step of repetition 1 may be written after 2 began
        log.step(SimpleNamespace(t_start_ns=t))
    with pytest.raises(ValueError, match="repetition 4 after 2"):
        log.start_repetition(4, 300)
    log.close()
    assert [(s["t"], s["repetition"]) for s in record_log.read_steps(tmp_path)] == [
        (50, 0),  # before repetition 1: the warm-up
        (100, 1),
        (199, 1),
        (200, 2),
        (350, 2),
    ]


def test_lines_written_before_repetitions_read_as_repetition_1(tmp_path):
    (tmp_path / "steps.jsonl").write_text('{"phase": "decode"}\n')
    (tmp_path / "sessions.jsonl").write_text('{"session_id": "s0"}\n')
    (tmp_path / "requests.jsonl").write_text(json.dumps(vars(a_record(1))) + "\n")
    assert record_log.read_steps(tmp_path) == [{"repetition": 1, "phase": "decode"}]
    assert record_log.read_sessions(tmp_path) == [{"repetition": 1, "session_id": "s0"}]
    assert record_log.read_requests(tmp_path)[0].repetition == 1


def test_opening_a_log_starts_the_files_over(tmp_path):
    (tmp_path / "requests.jsonl").write_text('{"old": 1}\n')
    RecordLog(tmp_path).close()
    assert (tmp_path / "requests.jsonl").read_text() == ""


def test_a_line_cut_by_a_kill_is_dropped(tmp_path):
    good = json.dumps({"a": 1})
    (tmp_path / "steps.jsonl").write_text(f'{good}\n{{"a": 2, "b"')
    assert record_log.read_steps(tmp_path) == [{"repetition": 1, "a": 1}]


def test_a_bad_line_in_the_middle_is_named(tmp_path):
    (tmp_path / "steps.jsonl").write_text('{"a": 1}\nnope\n{"a": 3}\n')
    with pytest.raises(UserError, match=r"steps.jsonl:2: not valid JSON"):
        record_log.read_steps(tmp_path)


def test_a_failed_write_is_reported_at_close(tmp_path):
    log = RecordLog(tmp_path, cost_step=lambda step: 1 / 0)
    log.step(1)
    with pytest.raises(UserError, match="writing the records failed: steps.jsonl: ZeroDivision"):
        log.close()


def test_a_record_with_server_timings_reads_back_as_written(tmp_path):
    record = a_record(1)
    record.server_timings = ServerTimings(
        source="llama.cpp timings + openai usage",
        prompt_ms=11.2,
        decode_ms=56.4,
        decode_ms_per_token=18.8,
        prompt_tokens=40,
        decode_tokens=3,
        cached_tokens=32,
    )
    record.max_tokens, record.ignore_eos, record.usage_reported = 64, True, True
    record.first_reasoning_ns, record.first_content_ns = 5, 7
    log = RecordLog(tmp_path)
    log.request(record)
    log.request(a_record(2))
    log.close()
    assert record_log.read_requests(tmp_path) == [record, a_record(2)]


def test_rewritten_requests_replace_the_file_whole(tmp_path):
    """What is learnt after the run (the server's timings from its log) replaces the lines."""
    log = RecordLog(tmp_path)
    log.request(a_record(1))
    log.request(a_record(2))
    log.close()
    timed = a_record(2)
    timed.server_timings = ServerTimings(source="llama.cpp log", prompt_ms=97.5, cached_tokens=8)
    record_log.rewrite_requests(tmp_path, [a_record(1), timed])
    assert record_log.read_requests(tmp_path) == [a_record(1), timed]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "requests.jsonl",
        "sessions.jsonl",
        "steps.jsonl",
    ]  # nothing left aside
    gone = tmp_path / "gone"
    with pytest.raises(WriteFailed, match=f"^{gone / 'requests.jsonl'}: cannot write \\(No such"):
        record_log.rewrite_requests(gone, [timed])


# The fields of a requests.jsonl line before server timings were recorded.
OLD_FIELDS = (
    "request_id session_id turn scheduled_ns sent_ns end_ns chunk_ns chunk_tokens "
    "num_prompt_tokens server_prompt_tokens server_completion_tokens cached_tokens output_text "
    "finish_reason error is_warmup repetition"
).split()


def test_a_line_from_before_server_timings_reads_with_the_defaults(tmp_path):
    old = {k: v for k, v in vars(a_record(1)).items() if k in OLD_FIELDS}
    (tmp_path / "requests.jsonl").write_text(json.dumps(old) + "\n")
    [record] = record_log.read_requests(tmp_path)
    assert record == a_record(1)
    assert (record.server_timings, record.max_tokens, record.usage_reported) == (None, 0, False)
    assert (record.first_reasoning_ns, record.first_content_ns, record.ignore_eos) == (
        None,
        None,
        False,
    )


class DiskFull:
    """A disk with room for `num_lines` more lines of the record file `name` (of any, when
    None), as `record_log._write`: the line after them goes out in part, then the write fails
    as a full disk's does (ENOSPC), and from then on every write does (`is_full`)."""

    def __init__(self, num_lines: int, name: str | None = None):
        self.left, self.name, self.is_full = num_lines, name, False
        self.real = record_log._write

    def __call__(self, f, data: bytes) -> None:
        if self.is_full:
            raise OSError(errno.ENOSPC, "No space left on device")
        if self.name is not None and not f.name.endswith(self.name):
            return self.real(f, data)
        lines = data.splitlines(keepends=True)
        fits = lines[: self.left]
        self.real(f, b"".join(fits))
        self.left -= len(fits)
        if len(fits) < len(lines):
            self.real(f, lines[len(fits)][:7])  # half a line reaches the disk
            self.is_full = True
            raise OSError(errno.ENOSPC, "No space left on device")
        return None


def no_space_left(monkeypatch) -> None:
    """shutil.disk_usage says the disk (200 KiB) is full."""
    usage = SimpleNamespace(total=200 * 1024, used=200 * 1024, free=0)
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage)


def test_a_full_disk_keeps_whole_lines_on_disk_and_the_rest_in_memory(tmp_path, monkeypatch):
    """Room for 3 lines: requests 1-3 are on disk whole (the 4th, cut in half, is cut off
    again), 4 and 5 are kept in memory, the failure is raised once, naming the file and the
    free space, and the run is told at once (`on_error`, from the writer thread)."""
    monkeypatch.setattr(record_log, "_write", DiskFull(3))
    no_space_left(monkeypatch)
    told = []
    log = RecordLog(tmp_path, on_error=lambda e: told.append((e, threading.current_thread())))
    for i in range(1, 6):
        log.request(a_record(i))
    log.session(SessionStats("s1", num_requests=1))
    with pytest.raises(WriteFailed) as failed:
        log.close()
    path = tmp_path / "requests.jsonl"
    assert str(failed.value) == (
        f"{path}: cannot write (No space left on device; 0 B free there); free some space and "
        "try again"
    )
    assert (failed.value.path, failed.value.free_bytes) == (path, 0)
    [(error, thread)] = told
    assert error is failed.value and thread.name == "llmbench-records"
    assert path.read_text().endswith("\n")  # whole lines only
    assert [r.request_id for r in record_log.read_requests(tmp_path)] == ["s1-t0", "s2-t0", "s3-t0"]
    assert log.num_written == {"requests.jsonl": 3, "steps.jsonl": 0, "sessions.jsonl": 0}
    unwritten = log.unwritten["requests.jsonl"]
    assert [row["request_id"] for row in unwritten] == ["s4-t0", "s5-t0"]
    assert [row["session_id"] for row in log.unwritten["sessions.jsonl"]] == ["s1"]
    assert (tmp_path / "sessions.jsonl").read_text() == ""  # nothing after the failure


def test_a_folder_where_the_log_cannot_open_its_files_is_one_line(tmp_path):
    (tmp_path / "steps.jsonl").mkdir()  # a folder where a file goes: open() fails
    with pytest.raises(WriteFailed, match=f"^{tmp_path / 'steps.jsonl'}: cannot write \\(Is a"):
        RecordLog(tmp_path)
