"""A run's result from its records: the summary, session metrics and roofline phases, the same
whether the run has just ended or `llmbench report` rebuilds it from the folder of a killed run.

A run writes `run-start.json` (a `RunResult` with an empty summary: spec, provenance, roofs)
before its first request, then appends its records (`record_log`). `finish` turns the start and
the records into the full result; `rebuild` does it from the files alone.

The summary pools every repetition (`--repeat`); `summary.repetitions` holds the same summary of
each repetition alone, and `summary.spread` how much the whole ones differ (`spread`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from itertools import pairwise
from pathlib import Path
from typing import Any

from llmbench.harness import metrics, record_log, telemetry
from llmbench.harness.cost import cost_summary, self_hosted_summary
from llmbench.harness.driver import SessionStats
from llmbench.harness.expert_stats_file import moe_summary
from llmbench.harness.failures import DEFAULT_MAX_FAILED_FRACTION
from llmbench.harness.prices import load_prices
from llmbench.harness.records import RequestRecord
from llmbench.harness.results import (
    RESULTS_FILE,
    MachineLoad,
    Phase,
    Roofline,
    RunResult,
    TelemetryInfo,
    read_results,
    write_results,
)
from llmbench.harness.run_warnings import run_warnings
from llmbench.harness.speculative_stats import speculative_summary
from llmbench.harness.spread import spread
from llmbench.roofline import analysis

START_FILE = "run-start.json"
KILLED = "killed: rebuilt from the record files by `llmbench report`"


def session_summary(sessions: Sequence[SessionStats]) -> dict[str, Any]:
    """Job-level metrics: how long sessions took and where the time went.

    Formula: means over the sessions that sent a request; prefix_cache_hit_rate =
    Σ cached prompt tokens / Σ prompt tokens of their requests.
    """
    done = [s for s in sessions if s.num_requests]
    if not done:
        return {"num_sessions": 0}

    def mean(values: list[float]) -> float:
        return sum(values) / len(values)

    prompt = sum(s.prompt_tokens for s in done)
    return {
        "num_sessions": len(done),
        "num_failed_sessions": sum(1 for s in done if s.num_failed),
        "mean_session_s": mean([(s.end_ns - s.start_ns) / 1e9 for s in done]),
        "mean_model_wait_s": mean([s.model_wait_ns / 1e9 for s in done]),
        "mean_tool_wait_s": mean([s.tool_wait_ns / 1e9 for s in done]),
        "mean_requests_per_session": mean([s.num_requests for s in done]),
        "prefix_cache_hit_rate": sum(s.cached_tokens for s in done) / prompt if prompt else None,
    }


def sessions_from_requests(records: Sequence[RequestRecord]) -> list[SessionStats]:
    """Each session's numbers from its measured requests, for a run killed before it wrote
    sessions.jsonl. The time between a reply and the next turn's scheduled send stands in for
    the tool or think time (it also holds the few milliseconds of preparing the request).

    Formula: start = first scheduled send, end = last end, model wait = Σ (end − sent),
    tool wait = Σ max(0, scheduled(k) − end(k − 1)).
    """
    by_session: dict[tuple[int, str], list[RequestRecord]] = {}
    for r in records:
        if not r.is_warmup:
            by_session.setdefault((r.repetition, r.session_id), []).append(r)
    sessions = []
    for (repetition, session_id), turns in by_session.items():
        turns.sort(key=lambda r: r.turn)
        sessions.append(
            SessionStats(
                session_id,
                start_ns=turns[0].scheduled_ns,
                end_ns=turns[-1].end_ns,
                model_wait_ns=sum(r.end_ns - r.sent_ns for r in turns),
                tool_wait_ns=sum(max(0, b.scheduled_ns - a.end_ns) for a, b in pairwise(turns)),
                num_requests=len(turns),
                num_failed=sum(not r.ok for r in turns),
                prompt_tokens=sum(r.num_prompt_tokens for r in turns),
                cached_tokens=sum(r.cached_tokens or 0 for r in turns),
                repetition=repetition,
            )
        )
    return sessions


def _summary_of(
    records: Sequence[RequestRecord],
    points: Sequence[dict[str, Any]],
    sessions: Sequence[SessionStats],
    slo: dict[str, float],
    is_busy: bool,
    roof: Roofline | None,
    num_endpoints: int,
) -> tuple[dict[str, Any], dict[str, dict[str, float | None]]]:
    """The summary of some measured records (a repetition, or all of them) with their sessions
    and roofline points, and the roofline phases of those points against `roof`'s roofs (routed
    over `num_endpoints` endpoints, 0: not routed)."""
    summary = metrics.summarize(records, slo, num_endpoints)
    summary["sessions"] = session_summary(sessions)
    summary["machine_busy"] = is_busy
    phases: dict[str, dict[str, float | None]] = {}
    if roof is not None:
        peaks = roof.roofs
        phases = analysis.phase_utilization(
            points, peaks and peaks.read_bytes_per_s, peaks and peaks.flops_per_s
        )
        summary["decode_mbu"] = phases.get("decode", {}).get("mbu")
        summary["prefill_mfu"] = phases.get("prefill", {}).get("mfu")
        summary["roofline_is_estimated"] = roof.is_estimated
    summary.update(moe_summary(points))  # a mixture of experts' routing: nothing when dense
    summary["speculative"] = speculative_summary(points)  # None: speculation off
    return summary, phases


def finish(
    start: RunResult,
    records: Sequence[RequestRecord],
    points: Sequence[dict[str, Any]],
    sessions: Sequence[SessionStats],
    telemetry_info: TelemetryInfo,
    load: MachineLoad,
    stop_reason: str | None,
    *,
    num_repetitions: int,
    num_whole_repetitions: int,
    is_rebuilt: bool = False,
) -> RunResult:
    """The result of a run that started as `start`: the summary of its requests and sessions,
    the roofline phases of its steps (`points`) against the roofs chosen at the start.

    The summary and phases pool the measured repetitions (warm-up records, repetition 0, left
    out); `summary.repetitions` has one summary per repetition from 1 to the last one started
    (`num_repetitions`, or the last that made a record; at least 1), each `is_partial` past the
    first `num_whole_repetitions`; `summary.spread` is over the whole ones only (a repetition
    cut short is not noise). `summary.warnings` lists what makes the numbers less than clean
    (`run_warnings`), one line each.
    """
    slo = dict(start.spec.get("slo") or {})
    is_busy = load.is_busy
    measured_points = [p for p in points if p.get("repetition", 1) >= 1]
    num_endpoints = len((start.spec.get("backend") or {}).get("urls") or ())
    summary, phases = _summary_of(
        records, measured_points, sessions, slo, is_busy, start.roofline, num_endpoints
    )
    last = max(
        [num_repetitions, num_whole_repetitions, 1]
        + [r.repetition for r in records if not r.is_warmup]
        + [s.repetition for s in sessions]
    )
    repetitions = []
    for number in range(1, last + 1):
        alone, _ = _summary_of(
            [r for r in records if r.repetition == number and not r.is_warmup],
            [p for p in measured_points if p.get("repetition", 1) == number],
            [s for s in sessions if s.repetition == number],
            slo,
            is_busy,
            start.roofline,
            num_endpoints,
        )
        repetitions.append(
            {"repetition": number, "is_partial": number > num_whole_repetitions, **alone}
        )
    summary["repetitions"] = repetitions
    summary["spread"] = spread([r for r in repetitions if not r["is_partial"]])
    sheet = start.spec.get("prices")
    currency = "USD"
    if sheet:  # no price sheet: no money, never a made-up price
        prices = load_prices(sheet)
        summary["cost"] = cost_summary(records, prices)
        currency = prices.currency
    price_per_hour = start.spec.get("gpu_hour_price")
    if price_per_hour:
        summary["self_hosted"] = self_hosted_summary(price_per_hour, currency, summary)
    summary["warnings"] = run_warnings(
        records,
        summary,
        load,
        backend=start.provenance.backend,
        max_failed_fraction=start.spec.get("max_failed_fraction", DEFAULT_MAX_FAILED_FRACTION),
        shared_tokens=start.provenance.shared_prefix_tokens,
        roofline=start.roofline,
        spec=start.spec,
        sweep_point=start.sweep_point,
    )
    roofs = start.roofline.roofs if start.roofline is not None else None
    if roofs is not None:  # an achieved rate above its roof: no MBU/MFU, this line instead
        summary["warnings"] += analysis.ceiling_warnings(
            phases, roofs.read_bytes_per_s, roofs.flops_per_s, roofs.label
        )
    roof = start.roofline
    if roof is not None:
        roof = dataclasses.replace(
            roof, phases={name: Phase(**values) for name, values in phases.items()}
        )
    return dataclasses.replace(
        start,
        interrupted=stop_reason is not None,
        stop_reason=stop_reason,
        is_rebuilt=is_rebuilt,
        provenance=dataclasses.replace(start.provenance, machine_load=load),
        summary=summary,
        roofline=roof,
        telemetry=telemetry_info,
    )


def can_rebuild(folder: Path) -> bool:
    """A folder whose run started (run-start.json) but never wrote results.json."""
    return (folder / START_FILE).is_file() and not (folder / RESULTS_FILE).is_file()


def rebuild(folder: Path) -> RunResult:
    """results.json of a killed run, from run-start.json and the record files; written into
    the folder and returned. The sessions come from sessions.jsonl, which gets a repetition's
    sessions when it ends: a repetition found there ran to its end; the sessions of the one the
    kill cut short are rebuilt from its requests. The telemetry comes from telemetry.csv. The
    openai backend's estimated decode points are made at the end of a run, so its rebuilt
    roofline is empty."""
    start = read_results(folder / START_FILE)
    records = record_log.read_requests(folder)
    sessions = [SessionStats(**row) for row in record_log.read_sessions(folder)]
    logged = {s.repetition for s in sessions}
    sessions += sessions_from_requests([r for r in records if r.repetition not in logged])
    samples = telemetry.read_csv(folder / "telemetry.csv")
    info = dataclasses.replace(start.telemetry, summary=telemetry.summarize(samples))
    result = finish(
        start,
        records,
        record_log.read_steps(folder),
        sessions,
        info,
        start.provenance.machine_load,
        stop_reason=KILLED,
        num_repetitions=0,  # as many as made a record
        num_whole_repetitions=max(logged, default=0),
        is_rebuilt=True,
    )
    write_results(folder, result)
    return result
