"""Tests for llmbench.serve.recorder: steps land in steps.jsonl off the caller's thread,
a bad folder is one clear error, a disk that falls behind costs steps, not memory, and a disk
that fails (no space left) or hangs costs steps, counted, never the server's shutdown."""

from __future__ import annotations

import dataclasses
import errno
import json
import threading
import time

import pytest

from llmbench.engine.records import StepRecord
from llmbench.errors import UserError
from llmbench.serve import recorder
from llmbench.serve.recorder import StepRecorder


def step(i: int) -> StepRecord:
    return StepRecord(
        t_start_ns=i * 10,
        t_end_ns=i * 10 + 7,
        num_prefill_tokens=i,
        num_decode_seqs=1,
        context_lens=(i, 3),
        query_lens=(1, 1),
        num_cached_tokens=0,
        num_blocks_used=2,
        num_blocks_total=8,
        num_preempted=0,
        num_waiting=0,
    )


def test_every_step_is_one_json_line_in_order(tmp_path):
    rec = StepRecorder(tmp_path / "new" / "folder")
    for i in range(500):
        rec.on_step(step(i))
    rec.close()
    lines = (tmp_path / "new" / "folder" / "steps.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in lines] == [
        json.loads(json.dumps(dataclasses.asdict(step(i)))) for i in range(500)
    ]
    assert rec.num_written == 500 and rec.num_dropped == 0


def test_steps_are_on_disk_while_serving_not_only_at_the_end(tmp_path):
    rec = StepRecorder(tmp_path)
    rec.on_step(step(1))
    path = tmp_path / "steps.jsonl"
    for _ in range(200):  # the writer flushes when its queue runs dry
        if path.read_text():
            break
        threading.Event().wait(0.01)
    assert json.loads(path.read_text())["t_end_ns"] == 17
    rec.close()


def test_an_unwritable_folder_is_a_user_error(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(UserError, match=r"serve --record: cannot write .*a-file/sub/steps.jsonl"):
        StepRecorder(blocker / "sub")


def test_a_full_queue_drops_steps_instead_of_blocking(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(recorder, "MAX_PENDING_STEPS", 3)
    rec = StepRecorder(tmp_path)
    writing = threading.Lock()
    writing.acquire()
    real_write = rec._file.write

    def slow_write(text: str) -> int:  # the disk stalls until the test lets it go
        with writing:
            return real_write(text)

    rec._file.write = slow_write
    rec.on_step(step(0))
    while not rec._pending.empty():  # the writer has taken step 0 and stalls on it
        threading.Event().wait(0.001)
    for i in range(1, 10):
        rec.on_step(step(i))  # returns at once even though nothing can be written
    writing.release()
    rec.close()
    # One step was taken by the writer (stalled), 3 waited in the queue, 6 were dropped.
    assert rec.num_written == 4 and rec.num_dropped == 6
    assert len((tmp_path / "steps.jsonl").read_text().splitlines()) == 4
    assert "dropped 6 steps" in capsys.readouterr().err


def wait_for(condition, limit_s: float = 30.0) -> bool:
    """Poll `condition` until it holds or `limit_s` passes (generous: the machine may be busy)."""
    deadline = time.monotonic() + limit_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        threading.Event().wait(0.005)
    return True


def test_a_failing_write_is_said_once_and_every_later_step_counted_dropped(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.setattr(recorder, "MAX_PENDING_STEPS", 3)
    rec = StepRecorder(tmp_path)

    def full_disk(text: str) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    rec._file.write = full_disk
    for i in range(10):  # one at a time: the writer keeps taking them after the failure
        rec.on_step(step(i))
        assert wait_for(lambda: rec._pending.empty()), "the writer stopped taking steps"
    assert wait_for(lambda: rec.num_dropped == 10)
    assert rec.num_written == 0 and rec.num_queue_full == 0 and rec.num_failed == 10
    [said] = capsys.readouterr().err.strip().splitlines()  # said once, not once a step
    assert said == (
        f"llmbench serve: --record cannot write {tmp_path / 'steps.jsonl'}: No space left on "
        "device; steps are no longer recorded (counted in llmbench_record_dropped_steps_total), "
        "serving goes on"
    )
    rec.close()
    assert capsys.readouterr().err.strip() == (
        "llmbench serve: --record dropped 10 steps (writing failed: No space left on device); "
        f"0 are in {tmp_path / 'steps.jsonl'}"
    )


def test_steps_before_a_failure_stay_in_the_file(tmp_path, capsys):
    rec = StepRecorder(tmp_path)
    rec.on_step(step(1))
    assert wait_for(lambda: rec.num_written == 1)

    def failing_disk(text: str) -> int:
        raise OSError(errno.EIO, "Input/output error")

    rec._file.write = failing_disk
    rec.on_step(step(2))
    rec.close()
    assert (rec.num_written, rec.num_dropped) == (1, 1)
    assert [json.loads(line)["t_end_ns"] for line in rec.path.read_text().splitlines()] == [17]
    assert "writing failed: Input/output error" in capsys.readouterr().err


def test_close_returns_promptly_when_the_disk_hangs_with_a_full_queue(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.setattr(recorder, "MAX_PENDING_STEPS", 3)
    rec = StepRecorder(tmp_path)
    hung = threading.Event()
    release = threading.Event()

    def hung_write(text: str) -> int:  # a disk that never answers (until the test ends)
        hung.set()
        release.wait()
        return 0

    rec._file.write = hung_write
    try:
        rec.on_step(step(0))
        assert wait_for(hung.is_set)  # the writer is stuck on step 0
        for i in range(1, 10):
            rec.on_step(step(i))  # 3 queue up, 6 are dropped
        assert rec._pending.full()
        closing = threading.Thread(target=rec.close, daemon=True)
        started = time.monotonic()
        closing.start()
        closing.join(timeout=30)  # CLOSE_TIMEOUT_S is 1 s; 30 s only fails a hang
        took_s = time.monotonic() - started
        assert not closing.is_alive(), "close() blocked on the full queue"
        assert took_s < 10
        assert (rec.num_written, rec.num_dropped) == (0, 10)
        assert capsys.readouterr().err.strip() == (
            "llmbench serve: --record dropped 10 steps (the disk had not taken them 1 s after "
            "shutdown; the disk fell 3 steps behind); "
            f"0 are in {tmp_path / 'steps.jsonl'}"
        )
    finally:
        release.set()
