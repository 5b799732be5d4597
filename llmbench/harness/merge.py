"""Shard folders merged into one run folder, as one process running the whole schedule writes
it: one `requests.jsonl`, `sessions.jsonl` and `steps.jsonl` on one clock, and a `results.json`
whose summary is made from the merged records by the same `finish` a single run uses.

The shards must be every shard 0 … N−1 of one run: the same spec hash, seed and sweep point.
Each shard's records are moved onto the target clock by `shards.shift_ns` (exact on one host,
as good as the clocks' sync across hosts). The openai backend's estimated roofline points are
made again from the merged records (a shard's own points see only its streams, so they cannot
be added up).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

from llmbench.errors import UserError
from llmbench.harness import client_load, record_log, run_roofs, shards
from llmbench.harness.driver import SessionStats
from llmbench.harness.records import RequestRecord
from llmbench.harness.results import (
    RESULTS_FILE,
    ClientLoad,
    MachineLoad,
    RunResult,
    TelemetryInfo,
    read_results,
    write_results,
)
from llmbench.harness.run_summary import (
    START_FILE,
    can_rebuild,
    finish,
    rebuild,
    sessions_from_requests,
)
from llmbench.harness.shards import ClockAnchor
from llmbench.harness.spec_load import spec_from_dict
from llmbench.harness.sweep_folders import point_folders


def shift_record(r: RequestRecord, delta_ns: int) -> RequestRecord:
    """A request record with every time moved by `delta_ns` (an unset end, 0, stays 0)."""
    return dataclasses.replace(
        r,
        scheduled_ns=r.scheduled_ns + delta_ns,
        sent_ns=r.sent_ns + delta_ns,
        end_ns=r.end_ns + delta_ns if r.end_ns else 0,
        chunk_ns=[t + delta_ns for t in r.chunk_ns],
    )


def shift_session(s: SessionStats, delta_ns: int) -> SessionStats:
    """A session with its start and end moved by `delta_ns`."""
    return dataclasses.replace(
        s, start_ns=s.start_ns + delta_ns, end_ns=s.end_ns + delta_ns if s.end_ns else 0
    )


def read_shards(folders: Sequence[Path]) -> list[tuple[Path, RunResult]]:
    """Each folder's result, in shard order, checked to be all the shards of one run; a shard
    killed before it wrote results.json gets it rebuilt from its record files first."""
    found = []
    for folder in folders:
        if not folder.is_dir():
            raise UserError(f"{folder}: no such folder; give the shard folders of one run")
        if can_rebuild(folder):
            rebuild(folder)
        if not (folder / RESULTS_FILE).is_file() and point_folders(folder):
            raise UserError(f"{folder}: a sweep folder; merge its point-* folders one by one")
        found.append((folder, read_results(folder)))
    check_shards(found)
    return sorted(found, key=lambda item: item[1].client.shard)


def check_shards(found: Sequence[tuple[Path, RunResult]]) -> None:
    """One line on why these are not the shards 0 … N−1 of one run, or nothing."""
    if not found:
        raise UserError("merge: give the shard folders of one run")
    for folder, result in found:
        if result.client is None or result.client.shard is None:
            raise UserError(
                f"{folder}: not a shard (it was not run with --shard i/N or load.workers)"
            )
    first_folder, first = found[0]
    p0 = first.provenance
    seen: dict[int, Path] = {}
    for folder, result in found:
        p, client = result.provenance, result.client
        if (p.spec_hash, p.seed) != (p0.spec_hash, p0.seed):
            raise UserError(
                f"{folder}: spec hash {p.spec_hash}, seed {p.seed}; {first_folder}: spec hash "
                f"{p0.spec_hash}, seed {p0.seed}: not shards of one run"
            )
        if client.num_shards != first.client.num_shards:
            raise UserError(
                f"{folder}: shard {client.shard} of {client.num_shards}; {first_folder}: shard "
                f"{first.client.shard} of {first.client.num_shards}: not shards of one run"
            )
        if result.sweep_point != first.sweep_point:
            raise UserError(
                f"{folder}: sweep point {result.sweep_point}; {first_folder}: sweep point "
                f"{first.sweep_point}: not shards of one run"
            )
        if client.shard in seen:
            raise UserError(f"{seen[client.shard]} and {folder}: both are shard {client.shard}")
        seen[client.shard] = folder
    count = first.client.num_shards
    missing = [i for i in range(count) if i not in seen]
    if missing:
        names = ", ".join(f"{i}/{count}" for i in missing)
        raise UserError(f"merge: shard {names} missing; give all {count} shard folders")


def _whole_repetitions(result: RunResult) -> int:
    """How many repetitions a shard ran to their end (the leading ones not partial)."""
    whole = 0
    for repetition in result.summary.get("repetitions", []):
        if repetition["is_partial"]:
            break
        whole += 1
    return whole


def _sessions(folder: Path, records: Sequence[RequestRecord]) -> list[SessionStats]:
    """A shard's sessions: those sessions.jsonl has, and for a repetition it lacks (cut short
    by a kill) the ones its requests give."""
    sessions = [SessionStats(**row) for row in record_log.read_sessions(folder)]
    logged = {s.repetition for s in sessions}
    return sessions + sessions_from_requests([r for r in records if r.repetition not in logged])


def merge_client(found: Sequence[tuple[Path, RunResult]], target: ClockAnchor) -> ClientLoad:
    """The client block of the merged run: every shard's processes, the server as the shards
    saw it (its CPU time: the largest shard's figure, as shards on one host time the same
    server over nearly the same window), and how the shards' clocks were aligned."""
    clients = [result.client for _, result in found]
    processes = [p for c in clients for p in c.processes]
    pids = sorted({pid for c in clients for pid in c.server_pids})
    affinities = [c.server_cpu_affinity for c in clients if c.server_cpu_affinity is not None]
    cpus = tuple(sorted({cpu for a in affinities for cpu in a})) if affinities else None
    server_s = [c.server_cpu_s for c in clients if c.server_cpu_s is not None]
    base = ClientLoad(shard=None, num_shards=len(found), clock=target)
    return client_load.combine(
        base,
        processes,
        pids,
        cpus,
        max(server_s) if server_s else None,
        clock_alignment=shards.alignment([c.clock for c in clients], target),
    )


def merge(
    folders: Sequence[Path],
    out: Path,
    *,
    target: ClockAnchor | None = None,
    load: MachineLoad | None = None,
    telemetry: TelemetryInfo | None = None,
    model_config=None,
) -> RunResult:
    """Merge the shard `folders` into the run folder `out` and return its result.

    `target`: the clock to put the records on (default: shard 0's); `load`: the machine's load
    around the whole run (default: shard 0's); `telemetry`: the run's own telemetry (default:
    none, a note pointing at each shard's); `model_config`: the model's shapes for the openai
    backend's estimated roofline (default: read from the spec's model).
    """
    found = read_shards(folders)
    out_resolved = out.resolve()
    for folder, _ in found:
        if folder.resolve() == out_resolved:
            raise UserError(f"--out {out}: is one of the shards; merge into another folder")
    first = found[0][1]
    target = target or first.client.clock
    records: list[RequestRecord] = []
    sessions: list[SessionStats] = []
    for folder, result in found:
        delta_ns = shards.shift_ns(result.client.clock, target)
        own = record_log.read_requests(folder)
        records += [shift_record(r, delta_ns) for r in own]
        sessions += [shift_session(s, delta_ns) for s in _sessions(folder, own)]
    records.sort(key=lambda r: (r.end_ns, r.request_id))
    sessions.sort(key=lambda s: (s.repetition, s.end_ns, s.session_id))
    num_repetitions = max(len(r.summary.get("repetitions", [])) for _, r in found)
    points = []
    if first.roofline is not None and first.roofline.is_estimated:
        spec = spec_from_dict(dict(first.spec), f"{found[0][0] / RESULTS_FILE}: spec")
        if model_config is None:
            from llmbench.engine.weights import open_weights

            model_config = open_weights(spec.model).config
        for number in range(1, num_repetitions + 1):
            own = [r for r in records if r.repetition == number]
            points += [
                {**p, "repetition": number}
                for p in run_roofs.estimated_points(spec, model_config, own, first.roofline)
            ]
    interrupted = [f"shard {r.client.shard}: {r.stop_reason}" for _, r in found if r.interrupted]
    if telemetry is None:
        (out / "telemetry.csv").unlink(missing_ok=True)  # an earlier run's, in a reused folder
        telemetry = TelemetryInfo(
            first.telemetry.interval_s,
            (f"merged from {len(found)} shards: each shard's telemetry is in its own folder",),
        )
    start = dataclasses.replace(first, summary={}, client=None)
    result = finish(
        start,
        records,
        points,
        sessions,
        telemetry,
        load or first.provenance.machine_load,
        "; ".join(interrupted) or None,
        num_repetitions=num_repetitions,
        num_whole_repetitions=min(_whole_repetitions(r) for _, r in found),
        is_rebuilt=any(r.is_rebuilt for _, r in found),
    )
    result = client_load.attach(result, merge_client(found, target))
    _write(out, result, records, sessions, points)
    return result


def _write(
    out: Path,
    result: RunResult,
    records: Sequence[RequestRecord],
    sessions: Sequence[SessionStats],
    points: Sequence[dict],
) -> None:
    """The merged folder's record files and results.json (nothing of an earlier run left)."""
    out.mkdir(parents=True, exist_ok=True)
    for stale in (RESULTS_FILE, START_FILE):
        (out / stale).unlink(missing_ok=True)
    log = record_log.RecordLog(out)
    for r in records:
        log.request(r)
    for s in sessions:
        log.session(s)
    for p in points:
        log.point(p)
    log.close()
    write_results(out, result)
