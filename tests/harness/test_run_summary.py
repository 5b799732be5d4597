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
    result = finish(
        start,
        two_turns(),
        decode_points(),
        [],
        telemetry,
        load,
        None,
        num_repetitions=1,
        num_whole_repetitions=1,
    )
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
    # One repetition: it is the whole run, and there is no spread (a mean only).
    (alone,) = summary["repetitions"]
    assert alone == {
        "repetition": 1,
        "is_partial": False,
        **{k: v for k, v in summary.items() if k not in ("repetitions", "spread", "warnings")},
    }
    assert summary["spread"]["decode_mbu"] == {"mean": decode.mbu, "stdev": None, "cv": None}
    stopped = finish(
        start, [], [], [], telemetry, load, "SIGTERM", num_repetitions=1, num_whole_repetitions=0
    )
    assert stopped.interrupted and stopped.stop_reason == "SIGTERM"
    assert [r["is_partial"] for r in stopped.summary["repetitions"]] == [True]
    assert stopped.summary["spread"]["tpot_ms.p50"] == {"mean": None, "stdev": None, "cv": None}


def test_finish_lists_the_run_warnings_by_the_spec_and_the_start():
    """The run-level warnings in `summary.warnings`, judged by the spec's max_failed_fraction
    and the shared prefix recorded at the start; a failure within the limit is said quietly."""
    turns = [dataclasses.replace(r, usage_reported=True) for r in two_turns()]
    turns[0] = dataclasses.replace(turns[0], cached_tokens=90, server_prompt_tokens=100)
    base = a_result()
    start = dataclasses.replace(
        base,
        spec={**base.spec, "max_failed_fraction": 0.5},
        provenance=dataclasses.replace(base.provenance, shared_prefix_tokens=40),
    )

    def warnings(start) -> list[str]:
        result = finish(
            start,
            turns,
            [],
            [],
            results.TelemetryInfo(0.1),
            start.provenance.machine_load,
            None,
            num_repetitions=1,
            num_whole_repetitions=1,
        )
        return result.summary["warnings"]

    assert warnings(start) == [
        "1 of 2 measured requests failed (50.0%); most common error (1 of 1): HTTP 500; "
        "latencies and rates are over the completed ones",
        "the server's prefix cache was warm before this run (first requests hit 90%: 1 of 1 "
        "first turns had more cached than the 40 tokens this run's prompts share): restart the "
        "server or vary `seed` for cold-cache numbers",
    ]
    # A spec from before max_failed_fraction: 0.05; no shared prefix measured: no cache check.
    older = dataclasses.replace(
        base, provenance=dataclasses.replace(base.provenance, shared_prefix_tokens=None)
    )
    (line,) = warnings(older)
    assert "(50.0%, above max_failed_fraction 5.0%)" in line


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


def three_repetitions() -> tuple[list[RequestRecord], list[dict]]:
    """Repetition k (1, 2, 3): one request of 3 tokens k + 1 ms apart (TPOT k + 1 ms), sent at
    k s, and one 1 ms decode step moving k MB (k GB/s). Plus the warm-up: a request and a step
    moving 100 MB, both repetition 0, which no summary may count."""
    records, points = [], []
    for k in (1, 2, 3):
        t0 = k * 1000 * MS
        gap = (k + 1) * MS
        records.append(
            RequestRecord(
                f"s0-t0-{k}",
                "s0" if k == 1 else f"rep{k}-s0",
                0,
                scheduled_ns=t0,
                sent_ns=t0,
                end_ns=t0 + 10 * MS + 2 * gap,
                chunk_ns=[t0 + 10 * MS, t0 + 10 * MS + gap, t0 + 10 * MS + 2 * gap],
                chunk_tokens=[1, 1, 1],
                num_prompt_tokens=100,
                cached_tokens=16 * k,
                repetition=k,
            )
        )
        points.append(
            {
                "t_start_ns": t0,
                "t_end_ns": t0 + MS,
                "phase": "decode",
                "bytes": k * 1e6,
                "flops": 0.0,
                "repetition": k,
            }
        )
    warm = RequestRecord("w", "warmup-s0", 0, 0, 0, 9 * MS, [MS], [1], is_warmup=True)
    warm_step = {"t_start_ns": 0, "t_end_ns": MS, "phase": "decode", "bytes": 1e8, "flops": 0.0}
    return [dataclasses.replace(warm, repetition=0), *records], [
        {**warm_step, "repetition": 0},
        *points,
    ]


def _finish(records, points, whole: int, stop_reason=None, started: int = 0, sessions=()):
    start = a_result()  # roofs: 19 GB/s read
    load = start.provenance.machine_load
    return finish(
        start,
        records,
        points,
        list(sessions),
        results.TelemetryInfo(0.1),
        load,
        stop_reason,
        num_repetitions=started,
        num_whole_repetitions=whole,
    )


def test_repetitions_pooled_alone_and_their_spread_by_hand():
    from llmbench.harness.metrics import summarize

    records, points = three_repetitions()
    result = _finish(records, points, whole=3)
    summary = result.summary
    # Pooled: every measured request (the warm-up's left out), every repetition's steps.
    pooled = summarize(records, {"ttft_ms": 200})
    assert {k: summary[k] for k in pooled} == pooled
    assert summary["tpot_ms"]["p50"] == 3.0 and summary["num_completed"] == 3
    assert summary["decode_mbu"] == pytest.approx(6e6 / 3e-3 / 19e9)  # the warm-up's 100 MB not
    assert result.roofline.phases["decode"].num_steps == 3
    # Alone: each repetition's own requests, window and steps.
    for k, alone in enumerate(summary["repetitions"], 1):
        own = summarize([r for r in records if r.repetition == k], {"ttft_ms": 200})
        assert {key: alone[key] for key in own} == own
        assert (alone["repetition"], alone["is_partial"]) == (k, False)
        assert alone["tpot_ms"]["p50"] == k + 1
        assert alone["decode_mbu"] == pytest.approx(k * 1e9 / 19e9)
        assert alone["prefix_cache_hit_rate"] == 16 * k / 100
        assert alone["duration_s"] == pytest.approx((10 + 2 * (k + 1)) / 1e3)
    # Spread: TPOT p50 2, 3, 4 ms → mean 3, stdev √((1 + 0 + 1) / 2) = 1, cv 1/3.
    spread = summary["spread"]
    assert spread["tpot_ms.p50"] == pytest.approx({"mean": 3.0, "stdev": 1.0, "cv": 1 / 3})
    # Decode MBU 1/19, 2/19, 3/19 → mean 2/19, stdev 1/19, cv 0.5.
    assert spread["decode_mbu"] == pytest.approx({"mean": 2 / 19, "stdev": 1 / 19, "cv": 0.5})
    assert spread["prefix_cache_hit_rate"] == pytest.approx(
        {"mean": 0.32, "stdev": 0.16, "cv": 0.5}
    )
    # TTFT is 10 ms in each: no spread at all.
    assert spread["ttft_ms.p50"] == {"mean": 10.0, "stdev": 0.0, "cv": 0.0}
    assert spread["prefill_mfu"] == {"mean": None, "stdev": None, "cv": None}  # no prefill step


def test_a_repetition_cut_short_is_partial_and_out_of_the_spread():
    records, points = three_repetitions()
    result = _finish(records, points, whole=2, stop_reason="SIGTERM")
    repetitions = result.summary["repetitions"]
    assert [(r["repetition"], r["is_partial"]) for r in repetitions] == [
        (1, False),
        (2, False),
        (3, True),
    ]
    assert result.summary["num_completed"] == 3  # the pooled numbers keep what it measured
    # TPOT p50 2, 3 ms → mean 2.5, stdev √((0.25 + 0.25) / 1).
    assert result.summary["spread"]["tpot_ms.p50"] == pytest.approx(
        {"mean": 2.5, "stdev": 0.5**0.5, "cv": 0.5**0.5 / 2.5}
    )
    # Stopped in repetition 2 before it made a record: 1 whole, 2 listed (empty) and partial.
    first = [r for r in records if r.repetition <= 1]
    stopped = _finish(first, points[:2], whole=1, stop_reason="SIGTERM", started=2)
    second = stopped.summary["repetitions"][1]
    assert (second["repetition"], second["is_partial"], second["num_completed"]) == (2, True, 0)
    assert stopped.summary["spread"]["tpot_ms.p50"] == {"mean": 2.0, "stdev": None, "cv": None}
    # Rebuilt from files, a repetition is known by its records: a session of 2 lists it too.
    rebuilt = _finish(first, points[:2], 1, "SIGTERM", sessions=[SessionStats("x", repetition=2)])
    assert [r["repetition"] for r in rebuilt.summary["repetitions"]] == [1, 2]
    assert [r["repetition"] for r in _finish(first, [], 1).summary["repetitions"]] == [1]


def test_sessions_from_requests_keep_their_repetition():
    records, _ = three_repetitions()
    again = dataclasses.replace(records[1], repetition=2)  # the same session id in repetition 2
    sessions = sessions_from_requests([*records, again])
    assert sorted((s.repetition, s.session_id, s.num_requests) for s in sessions) == [
        (1, "s0", 1),
        (2, "rep2-s0", 1),
        (2, "s0", 1),
        (3, "rep3-s0", 1),
    ]


def test_a_run_killed_in_repetition_2_is_rebuilt_with_1_whole_and_2_partial(tmp_path):
    records, points = three_repetitions()
    records = [r for r in records if r.repetition <= 2]
    start = dataclasses.replace(a_result(), summary={}, stop_reason="not finished")
    results.write_results(tmp_path, start, START_FILE)
    lines = [json.dumps(dataclasses.asdict(r)) for r in records]
    (tmp_path / "requests.jsonl").write_text("\n".join(lines) + "\n")
    (tmp_path / "steps.jsonl").write_text("".join(json.dumps(p) + "\n" for p in points[:3]))
    # Repetition 1 ended: its session was logged; repetition 2 was killed before it ended.
    one = SessionStats("s0", 0, 5, 5, 0, 1, 0, 100, 16, repetition=1)
    (tmp_path / "sessions.jsonl").write_text(json.dumps(dataclasses.asdict(one)) + "\n")

    summary = rebuild(tmp_path).summary
    assert [(r["repetition"], r["is_partial"]) for r in summary["repetitions"]] == [
        (1, False),
        (2, True),
    ]
    assert summary["sessions"]["num_sessions"] == 2  # one logged, one from its requests
    assert summary["repetitions"][1]["sessions"]["num_sessions"] == 1
    assert summary["repetitions"][1]["decode_mbu"] == pytest.approx(2e9 / 19e9)
    assert summary["spread"]["decode_mbu"] == pytest.approx(
        {"mean": 1 / 19, "stdev": None, "cv": None}
    )


def test_a_rebuilt_run_keeps_the_servers_timings(tmp_path):
    """The server-vs-client split comes back from requests.jsonl alone (`llmbench report`)."""
    from llmbench.harness.records import ServerTimings

    start = dataclasses.replace(a_result(), summary={}, stop_reason="not finished")
    results.write_results(tmp_path, start, START_FILE)
    timed = dataclasses.replace(
        two_turns()[0], server_timings=ServerTimings("llama.cpp", prompt_ms=7.0, decode_ms=0.5)
    )
    (tmp_path / "requests.jsonl").write_text(json.dumps(dataclasses.asdict(timed)) + "\n")
    summary = rebuild(tmp_path).summary
    # Sent at 1 ms, first token at 10 ms: 9 ms from the send, 7 of them the server's prompt.
    assert summary["server_prompt_ms"]["mean"] == 7.0
    assert summary["ttft_overhead_ms"]["mean"] == pytest.approx(2.0)
    assert summary["server_decode_ms_per_token"] is None  # decode_ms without its token count
