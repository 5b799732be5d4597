"""Merging shard folders: records put on one clock, a summary equal to the one of all records
together, and one line for folders that are not the shards of one run."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from llmbench.errors import UserError
from llmbench.harness import metrics, record_log
from llmbench.harness.driver import SessionStats
from llmbench.harness.merge import merge
from llmbench.harness.record_log import RecordLog
from llmbench.harness.records import RequestRecord
from llmbench.harness.results import (
    ClientLoad,
    ClientProcess,
    Device,
    MachineLoad,
    Provenance,
    RunResult,
    TelemetryInfo,
    read_results,
    write_results,
)
from llmbench.harness.run_summary import START_FILE
from llmbench.harness.shards import ClockAnchor
from llmbench.harness.spec import RunSpec

S = 1_000_000_000
MS = 1_000_000
SPEC = RunSpec(name="merged")
SPEC = dataclasses.replace(
    SPEC, backend=dataclasses.replace(SPEC.backend, kind="openai", url="http://127.0.0.1:1/v1")
)
# Shard 0's perf_counter is CLOCK_MONOTONIC; shard 1's runs 5 s ahead of it (same boot).
CLOCK_0 = ClockAnchor(
    perf_ns=100 * S, monotonic_ns=100 * S, unix_ns=1_700_000_000 * S, host="h", boot_id="b"
)
CLOCK_1 = ClockAnchor(
    perf_ns=205 * S, monotonic_ns=200 * S, unix_ns=1_700_000_100 * S, host="h", boot_id="b"
)
SHIFT_1 = -5 * S


def request(request_id: str, scheduled_ns: int, *, is_warmup=False, ok=True) -> RequestRecord:
    """Sent 1 ms late, tokens at +20 and +30 ms, ended at +31 ms."""
    return RequestRecord(
        request_id=request_id,
        session_id=request_id.split("-t")[0],
        turn=0,
        scheduled_ns=scheduled_ns,
        sent_ns=scheduled_ns + MS,
        end_ns=scheduled_ns + 31 * MS,
        chunk_ns=[scheduled_ns + 20 * MS, scheduled_ns + 30 * MS],
        chunk_tokens=[1, 2],
        num_prompt_tokens=10,
        error=None if ok else "HTTP 500: boom",
        is_warmup=is_warmup,
        repetition=0 if is_warmup else 1,
    )


def session_of(r: RequestRecord) -> SessionStats:
    return SessionStats(r.session_id, r.scheduled_ns, r.end_ns, 30 * MS, 0, 1, int(not r.ok), 10, 0)


def result_of(index: int, count: int, clock: ClockAnchor, **changes) -> RunResult:
    spec = changes.pop("spec", SPEC)
    provenance = Provenance(
        git_sha=None,
        versions={},
        host="h",
        platform="linux",
        device=Device("remote", url=spec.backend.url),
        model=spec.model,
        dtype=spec.dtype,
        backend="openai",
        spec_hash=changes.pop("spec_hash", spec.hash()),
        workload_hash="w",
        seed=spec.seed,
        machine_load=MachineLoad(2, 0.1, 0.1, 0.0, 0.0, False),
        created_unix_s=1.7e9,
    )
    process = ClientProcess(index, 10 + index, (0, 1), 1.0, 0.1 * (index + 1), 0.0, 0.1)
    client = ClientLoad(shard=index, num_shards=count, clock=clock, processes=(process,), cpu_s=0.1)
    return RunResult(
        name=spec.name,
        interrupted=False,
        stop_reason=None,
        is_rebuilt=False,
        sweep_point=changes.pop("sweep_point", None),
        spec=json.loads(json.dumps(spec.to_dict())),
        provenance=provenance,
        summary={"repetitions": [{"repetition": 1, "is_partial": False}]},
        roofline=None,
        telemetry=TelemetryInfo(0.1),
        client=changes.pop("client", client),
        **changes,
    )


def write_shard(folder: Path, result: RunResult, records: list[RequestRecord], name=None) -> Path:
    folder.mkdir(parents=True)
    log = RecordLog(folder)
    for r in records:
        log.request(r)
    for r in records:
        if not r.is_warmup:
            log.session(session_of(r))
    log.close()
    write_results(folder, result, *([name] if name else []))
    return folder


def two_shards(tmp_path: Path) -> tuple[list[Path], list[RequestRecord]]:
    """Shard 0: a warm-up, s0 at 1.0 s and s2 at 1.2 s; shard 1: s1 at 1.1 s (failed) and s3
    at 1.15 s, on its own clock. Returns the folders and the records on shard 0's clock."""
    zero = [request("warmup-s0-t0", int(0.5 * S), is_warmup=True), request("s0-t0", S)]
    zero.append(request("s2-t0", int(1.2 * S)))
    one = [request("s1-t0", int(6.1 * S), ok=False), request("s3-t0", int(6.15 * S))]
    folders = [
        write_shard(tmp_path / "a", result_of(0, 2, CLOCK_0), zero),
        write_shard(tmp_path / "b", result_of(1, 2, CLOCK_1), one),
    ]
    shifted = [
        dataclasses.replace(
            r,
            scheduled_ns=r.scheduled_ns + SHIFT_1,
            sent_ns=r.sent_ns + SHIFT_1,
            end_ns=r.end_ns + SHIFT_1,
            chunk_ns=[t + SHIFT_1 for t in r.chunk_ns],
        )
        for r in one
    ]
    return folders, zero + shifted


def test_merged_records_are_on_one_clock_and_the_summary_is_theirs(tmp_path):
    folders, expected = two_shards(tmp_path)
    result = merge(folders, tmp_path / "out")
    merged = record_log.read_requests(tmp_path / "out")
    assert merged == sorted(expected, key=lambda r: (r.end_ns, r.request_id))
    assert [r.request_id for r in merged] == [
        "warmup-s0-t0", "s0-t0", "s1-t0", "s3-t0", "s2-t0"
    ]  # fmt: skip
    # The window: first send (s0: 1.001 s) to last end (s2: 1.231 s); 3 completed requests of
    # 3 tokens each, the failed s1 left out.
    assert result.summary["duration_s"] == pytest.approx(0.230)
    assert result.summary["output_tok_per_s"] == pytest.approx(9 / 0.230)
    assert result.summary["num_completed"] == 3 and result.summary["num_failed"] == 1
    alone = metrics.summarize(merged, {})
    assert {k: result.summary[k] for k in alone} == alone
    assert read_results(tmp_path / "out") == result
    sessions = record_log.read_sessions(tmp_path / "out")
    assert [(s["session_id"], s["start_ns"]) for s in sessions] == [
        ("s0", S), ("s1", int(1.1 * S)), ("s3", int(1.15 * S)), ("s2", int(1.2 * S))
    ]  # fmt: skip
    client = result.client
    assert (client.shard, client.num_shards, client.clock) == (None, 2, CLOCK_0)
    assert [p.shard for p in client.processes] == [0, 1]
    assert client.cpu_s == pytest.approx(0.3)
    assert client.clock_alignment.startswith("CLOCK_MONOTONIC")
    assert result.spec["name"] == "merged" and not result.interrupted


def test_the_merge_goes_onto_the_clock_it_is_given(tmp_path):
    folders, expected = two_shards(tmp_path)
    target = dataclasses.replace(CLOCK_0, perf_ns=CLOCK_0.perf_ns + 3 * S)  # perf = mono + 3 s
    merge(folders, tmp_path / "out", target=target)
    first = record_log.read_requests(tmp_path / "out")[1]
    assert (first.request_id, first.scheduled_ns) == ("s0-t0", 4 * S)


def test_a_shard_killed_before_its_results_is_rebuilt_then_merged(tmp_path):
    zero = [request("s0-t0", S)]
    one = [request("s1-t0", int(6.1 * S))]
    start = dataclasses.replace(
        result_of(1, 2, CLOCK_1), interrupted=True, stop_reason="not finished", summary={}
    )
    folders = [
        write_shard(tmp_path / "a", result_of(0, 2, CLOCK_0), zero),
        write_shard(tmp_path / "b", start, one, name=START_FILE),
    ]
    result = merge(folders, tmp_path / "out")
    assert result.summary["num_completed"] == 2 and result.is_rebuilt and result.interrupted
    assert result.stop_reason.startswith("shard 1: killed: rebuilt from the record files")
    assert (tmp_path / "b" / "results.json").is_file()


def test_folders_that_are_not_the_shards_of_one_run_are_refused_in_one_line(tmp_path):
    r = [request("s0-t0", S)]
    a = write_shard(tmp_path / "a", result_of(0, 2, CLOCK_0), r)
    b = write_shard(tmp_path / "b", result_of(1, 2, CLOCK_1), r)
    seeded = dataclasses.replace(SPEC, seed=7)
    c = write_shard(tmp_path / "c", result_of(1, 2, CLOCK_1, spec=seeded), r)
    d = write_shard(tmp_path / "d", result_of(1, 2, CLOCK_1, spec_hash="other"), r)
    e = write_shard(tmp_path / "e", result_of(0, 2, CLOCK_0, client=None), r)
    f = write_shard(tmp_path / "f", result_of(1, 3, CLOCK_0), r)
    g = write_shard(tmp_path / "g", result_of(0, 2, CLOCK_0), r)
    i = write_shard(tmp_path / "i", result_of(1, 2, CLOCK_1, sweep_point=4.0), r)
    out = tmp_path / "out"
    h = SPEC.hash()
    cases = [
        ([a, c], f"{c}: spec hash {seeded.hash()}, seed 7; {a}: spec hash {h}, seed 0: not "
         "shards of one run"),
        ([a, d], f"{d}: spec hash other, seed 0; {a}: spec hash {h}, seed 0: not shards of one "
         "run"),
        ([e, b], f"{e}: not a shard (it was not run with --shard i/N or load.workers)"),
        ([a, f], f"{f}: shard 1 of 3; {a}: shard 0 of 2: not shards of one run"),
        ([a, i], f"{i}: sweep point 4.0; {a}: sweep point None: not shards of one run"),
        ([a, g], f"{a} and {g}: both are shard 0"),
        ([a], "merge: shard 1/2 missing; give all 2 shard folders"),
        ([tmp_path / "nope"], f"{tmp_path / 'nope'}: no such folder; give the shard folders of "
         "one run"),
    ]  # fmt: skip
    for folders, message in cases:
        with pytest.raises(UserError) as err:
            merge(folders, out)
        assert str(err.value) == message
    with pytest.raises(UserError, match=r"--out .*/a: is one of the shards"):
        merge([a, b], a)
    assert not (out / "results.json").exists()
