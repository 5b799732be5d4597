"""A run's result from its records, at the end of a run and rebuilt after a kill."""

from __future__ import annotations

import dataclasses
import json

import pytest

from llmbench.harness import results
from llmbench.harness.driver import SessionStats
from llmbench.harness.records import RequestRecord
from llmbench.harness.run_summary import (
    KILLED,
    START_FILE,
    can_rebuild,
    finish,
    rebuild,
    session_summary,
    sessions_from_requests,
)
from tests.harness.test_results import a_result

MS = 1_000_000


def test_session_summary_by_hand():
    sessions = [
        SessionStats(
            "a",
            start_ns=0,
            end_ns=4_000_000_000,
            model_wait_ns=3_000_000_000,
            tool_wait_ns=1_000_000_000,
            num_requests=3,
            prompt_tokens=300,
            cached_tokens=200,
        ),
        SessionStats(
            "b",
            start_ns=0,
            end_ns=2_000_000_000,
            model_wait_ns=2_000_000_000,
            num_requests=1,
            num_failed=1,
            prompt_tokens=100,
            cached_tokens=0,
        ),
    ]
    assert session_summary(sessions) == {
        "num_sessions": 2,
        "num_failed_sessions": 1,
        "mean_session_s": 3.0,
        "mean_model_wait_s": 2.5,
        "mean_tool_wait_s": 0.5,
        "mean_requests_per_session": 2.0,
        "prefix_cache_hit_rate": 0.5,  # (200 + 0) / (300 + 100)
    }
    assert session_summary([]) == {"num_sessions": 0}


def two_turns() -> list[RequestRecord]:
    """Session s: turn 0 sent at 0, ends at 12 ms; a 5 ms tool call; turn 1 sent at 17 ms,
    ends at 30 ms and fails. Plus a warm-up request, which is not part of any session."""
    return [
        RequestRecord(
            "s-t0",
            "s",
            0,
            scheduled_ns=0,
            sent_ns=1 * MS,
            end_ns=12 * MS,
            chunk_ns=[10 * MS, 11 * MS, 12 * MS],
            chunk_tokens=[1, 1, 1],
            num_prompt_tokens=100,
            cached_tokens=0,
        ),
        RequestRecord(
            "s-t1",
            "s",
            1,
            scheduled_ns=17 * MS,
            sent_ns=18 * MS,
            end_ns=30 * MS,
            num_prompt_tokens=150,
            cached_tokens=96,
            error="HTTP 500",
        ),
        RequestRecord("w-t0", "w", 0, scheduled_ns=0, sent_ns=0, end_ns=5, is_warmup=True),
    ]


def test_sessions_from_requests_by_hand():
    (stats,) = sessions_from_requests(list(reversed(two_turns())))
    assert stats == SessionStats(
        "s",
        start_ns=0,
        end_ns=30 * MS,
        model_wait_ns=(12 - 1) * MS + (30 - 18) * MS,
        tool_wait_ns=(17 - 12) * MS,
        num_requests=2,
        num_failed=1,
        prompt_tokens=250,
        cached_tokens=96,
    )


def decode_points() -> list[dict]:
    """Two decode steps of 1 ms moving 1 MB each: 1 GB/s; 2 MFLOP each: 2 GFLOP/s."""
    return [
        {"t_start_ns": t, "t_end_ns": t + MS, "phase": "decode", "bytes": 1e6, "flops": 2e6}
        for t in (0, 5 * MS)
    ]


def test_finish_fills_summary_and_phases_against_the_start_roofs():
    start = a_result()  # roofs: 19 GB/s read, 98 GFLOP/s
    load = dataclasses.replace(start.provenance.machine_load, is_busy=True)
    telemetry = results.TelemetryInfo(0.1, (), {"rss_bytes": {"mean": 3.0, "max": 4}})
    result = finish(start, two_turns(), decode_points(), [], telemetry, load, None)
    assert (result.interrupted, result.stop_reason, result.is_rebuilt) == (False, None, False)
    decode = result.roofline.phases["decode"]
    assert decode.bytes_per_s == pytest.approx(1e9)
    assert decode.mbu == pytest.approx(1e9 / 19e9)
    assert decode.mfu == pytest.approx(2e9 / 98e9)
    summary = result.summary
    assert summary["decode_mbu"] == decode.mbu and summary["prefill_mfu"] is None
    assert summary["num_completed"] == 1 and summary["num_failed"] == 1
    assert summary["ttft_ms"]["mean"] == 10.0  # first token at 10 ms, scheduled at 0
    assert summary["machine_busy"] is True and result.provenance.machine_load == load
    assert summary["sessions"] == {"num_sessions": 0}
    assert result.telemetry == telemetry
    stopped = finish(start, [], [], [], telemetry, load, "SIGTERM")
    assert stopped.interrupted and stopped.stop_reason == "SIGTERM"


def test_a_killed_run_is_rebuilt_from_its_files(tmp_path):
    start = dataclasses.replace(a_result(), summary={}, stop_reason="not finished")
    results.write_results(tmp_path, start, START_FILE)
    lines = [json.dumps(dataclasses.asdict(r)) for r in two_turns()]
    (tmp_path / "requests.jsonl").write_text("\n".join(lines) + "\n")
    steps = "".join(json.dumps(p) + "\n" for p in decode_points())
    (tmp_path / "steps.jsonl").write_text(steps + '{"t_start_ns": 9')  # cut by the kill
    (tmp_path / "telemetry.csv").write_text("t_ns,rss_bytes\n1,100\n2,300\n3,")
    assert can_rebuild(tmp_path)

    result = rebuild(tmp_path)
    assert results.read_results(tmp_path) == result
    assert not can_rebuild(tmp_path)
    assert (result.interrupted, result.stop_reason, result.is_rebuilt) == (True, KILLED, True)
    assert result.summary["num_completed"] == 1 and result.summary["num_failed"] == 1
    assert result.summary["sessions"]["num_sessions"] == 1  # from the requests
    assert result.summary["sessions"]["mean_tool_wait_s"] == 0.005
    assert result.roofline.phases["decode"].num_steps == 2
    assert result.telemetry.summary == {"rss_bytes": {"mean": 200.0, "max": 300.0}}
    assert result.provenance == start.provenance
