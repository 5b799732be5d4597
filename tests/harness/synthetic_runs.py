"""Run folders drawn from a known distribution, written through the project's own writers
(`results.write_results`, `record_log.RecordLog`): what `llmbench compare` is tested on.

Each repetition sends `num_requests` requests one after another. Per request: TTFT lognormal
(median 50 ms × slowdown, log-sd 0.3), TPOT lognormal (median 20 ms × slowdown, log-sd 0.2),
16 output tokens one chunk each; every repetition also shifts its latencies by a run-to-run
factor of log-sd `rep_sd`. Each request is one prefill step (sent → first token) and one decode
step per later token, costed so that MBU = 0.6 and MFU = 0.3 at the median speeds: a slower NEW
is slower on every metric at once, as slower code would be. One warm-up request (TTFT 5 s)
precedes the measured ones: counted anywhere, it would show.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np

from llmbench.harness import metrics
from llmbench.harness.record_log import RecordLog
from llmbench.harness.records import RequestRecord
from llmbench.harness.results import (
    Device,
    HardwareCeilings,
    MachineLoad,
    Phase,
    Provenance,
    Roofline,
    Roofs,
    RunResult,
    TelemetryInfo,
    write_results,
)
from llmbench.harness.spec import RunSpec
from llmbench.roofline import analysis

READ_BYTES_PER_S = 19e9
FLOPS_PER_S = 98e9
TTFT_MS, TPOT_MS = 50.0, 20.0  # medians at slowdown 1
DECODE_BYTES = 0.6 * READ_BYTES_PER_S * TPOT_MS / 1e3  # MBU 0.6 at the median TPOT
DECODE_FLOPS = 2 * 135e6
PREFILL_FLOPS = 0.3 * FLOPS_PER_S * TTFT_MS / 1e3  # MFU 0.3 at the median TTFT
PREFILL_BYTES = 300e6
NUM_OUTPUT_TOKENS = 16
NS_PER_MS = 1_000_000


def spec_of(sessions: int = 8) -> RunSpec:
    """The spec the synthetic runs claim: the tiny model, `sessions` sessions."""
    spec = RunSpec(model="synthetic:tiny", name="synthetic")
    return dataclasses.replace(spec, workload=dataclasses.replace(spec.workload, sessions=sessions))


def _request(
    rng,
    request_id: str,
    t_ns: int,
    ttft_ms: float,
    tpot_ms: float,
    rep: int,
    *,
    is_warmup: bool = False,
) -> tuple[RequestRecord, list[dict[str, Any]]]:
    """One request starting at `t_ns` and its roofline points (one prefill, then decode)."""
    sent = t_ns + int(rng.uniform(0.05, 0.3) * NS_PER_MS)
    first = t_ns + int(ttft_ms * NS_PER_MS)
    chunks = [first + int(i * tpot_ms * NS_PER_MS) for i in range(NUM_OUTPUT_TOKENS)]
    record = RequestRecord(
        request_id=request_id,
        session_id=request_id,
        turn=0,
        scheduled_ns=t_ns,
        sent_ns=sent,
        end_ns=chunks[-1] + NS_PER_MS // 10,
        chunk_ns=chunks,
        chunk_tokens=[1] * NUM_OUTPUT_TOKENS,
        num_prompt_tokens=100,
        cached_tokens=0,
        finish_reason="length",
        is_warmup=is_warmup,
        repetition=rep,
    )
    steps = [_step("prefill", sent, first, PREFILL_FLOPS, PREFILL_BYTES, rep)]
    steps += [
        _step("decode", a, b, DECODE_FLOPS, DECODE_BYTES, rep)
        for a, b in zip(chunks, chunks[1:], strict=False)
    ]
    return record, steps


def _step(phase: str, t_start: int, t_end: int, flops: float, num_bytes: float, rep: int) -> dict:
    return {
        "t_start_ns": t_start,
        "t_end_ns": t_end,
        "phase": phase,
        "num_seqs": 1,
        "flops": flops,
        "bytes": num_bytes,
        "repetition": rep,
    }


def _summary(records: list[RequestRecord], steps: list[dict], is_busy: bool) -> dict[str, Any]:
    """What a run writes as its summary: `metrics.summarize` plus the roofline phases."""
    summary = metrics.summarize(records)
    phases = analysis.phase_utilization(steps, READ_BYTES_PER_S, FLOPS_PER_S)
    summary["sessions"] = {"num_sessions": 0}
    summary["machine_busy"] = is_busy
    summary["decode_mbu"] = phases["decode"]["mbu"]
    summary["prefill_mfu"] = phases["prefill"]["mfu"]
    summary["roofline_is_estimated"] = False
    return summary


def write_run(
    folder: Path,
    seed: int,
    *,
    slowdown: float = 1.0,
    num_repetitions: int | None = 3,
    num_requests: int = 40,
    rep_sd: float = 0.03,
    sessions: int = 8,
    device_name: str = "Test CPU",
    is_busy: bool = False,
    sweep_point: float | None = None,
) -> Path:
    """A whole run folder (results.json, requests.jsonl, steps.jsonl); returns the folder.

    `num_repetitions=None` writes a file from before repetitions: one repetition, no
    `summary.repetitions`."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    log = RecordLog(folder)
    t = 1_000_000_000
    record, points = _request(rng, "warmup", t, 5000.0, TPOT_MS, 1, is_warmup=True)
    everything, all_steps = [record], list(points)
    t = record.end_ns + NS_PER_MS
    per_repetition = []
    for rep in range(1, (num_repetitions or 1) + 1):
        shift = rng.normal(0.0, rep_sd)
        ttft = rng.lognormal(np.log(TTFT_MS * slowdown) + shift, 0.3, size=num_requests)
        tpot = rng.lognormal(np.log(TPOT_MS * slowdown) + shift, 0.2, size=num_requests)
        records, steps = [], []
        for i in range(num_requests):
            record, points = _request(rng, f"r{rep}-{i}", t, ttft[i], tpot[i], rep)
            records.append(record)
            steps += points
            t = record.end_ns + NS_PER_MS
        summary = _summary(records, steps, is_busy)
        per_repetition.append({"repetition": rep, "is_partial": False, **summary})
        everything += records
        all_steps += steps
    for record in everything:
        log.request(record)
    for point in all_steps:
        log.point(point)
    log.close()

    spec = spec_of(sessions)
    summary = _summary(everything, all_steps, is_busy)
    if num_repetitions is not None:
        summary["repetitions"] = per_repetition
    phases = analysis.phase_utilization(all_steps, READ_BYTES_PER_S, FLOPS_PER_S)
    spec_dict = json.loads(json.dumps(spec.to_dict()))
    workload = json.dumps(spec_dict["workload"], sort_keys=True).encode()
    roofs = Roofs(f"{device_name} (measured)", READ_BYTES_PER_S, FLOPS_PER_S)
    result = RunResult(
        name=spec.name,
        interrupted=False,
        stop_reason=None,
        is_rebuilt=False,
        sweep_point=sweep_point,
        spec=spec_dict,
        provenance=Provenance(
            git_sha="0123abc",
            versions={"python": "3.12"},
            host="test",
            platform="test",
            device=Device("cpu", device_name, 2, "torch reference ops"),
            model=spec.model,
            dtype=spec.dtype,
            backend="engine",
            spec_hash=spec.hash(),
            workload_hash=hashlib.sha256(workload).hexdigest()[:16],
            seed=spec.seed,
            machine_load=MachineLoad(2, 0.1, 0.2, 0.0, 1.0 if is_busy else 0.0, is_busy),
            created_unix_s=0.0,
            hardware=HardwareCeilings(
                device=device_name,
                device_type="cpu",
                threads=2,
                torch="2.13.0",
                copy_bytes_per_s=16.6e9,
                read_bytes_per_s=READ_BYTES_PER_S,
                matmul_flops_per_s={"float32": FLOPS_PER_S},
                method="synthetic",
            ),
        ),
        summary=summary,
        roofline=Roofline(
            is_estimated=False,
            method="synthetic",
            dtype="float32",
            weight_bytes_per_param=4.0,
            kv_bytes_per_elem=4.0,
            roofs=roofs,
            datasheet_roofs=None,
            phases={name: Phase(**values) for name, values in phases.items()},
        ),
        telemetry=TelemetryInfo(interval_s=0.1),
    )
    write_results(folder, result)
    return folder


def write_sweep(folder: Path, seed: int, points=(1, 2), **kwargs) -> Path:
    """A sweep folder: a run folder `point-<v>/` per point, seeds `seed`, `seed + 1`, ..."""
    for k, value in enumerate(points):
        write_run(folder / f"point-{value:g}", seed + k, sweep_point=float(value), **kwargs)
    return folder
