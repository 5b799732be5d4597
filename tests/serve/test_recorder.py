"""Tests for llmbench.serve.recorder: steps land in steps.jsonl off the caller's thread,
a bad folder is one clear error, and a disk that falls behind costs steps, not memory."""

from __future__ import annotations

import dataclasses
import json
import threading

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
