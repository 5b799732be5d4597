"""`llmbench run`: spec → run folder checked → backend → roofs → workload → results + reports.

The order keeps every measurement: the output folder is created and checked before anything
slow; the hardware roofs are measured (or read from the cache) before the workload, with a
progress line; `run-start.json` is written before the first request and each record is appended
as it completes (`record_log`); SIGINT, SIGTERM and SIGHUP stop the workload and the run saves
what it measured (`run_signals`); an engine crash ends it the same way, then re-raises.
The backend is opened and the roofs settled once per run point; the warm-up runs once and the
measured phase `spec.repeat` times (`run_repetitions`).
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from llmbench.errors import BackendFailure, UserError
from llmbench.harness import (
    arrivals,
    client_load,
    failures,
    provenance,
    run_roofs,
    run_warnings,
    shards,
    summary_lines,
)
from llmbench.harness.backends.server_log import ServerLog
from llmbench.harness.driver import DriveOptions, Driver
from llmbench.harness.experts import EXPERTS_FILE, snapshots_of
from llmbench.harness.record_log import RecordLog, read_steps, rewrite_requests
from llmbench.harness.results import (
    RESULTS_FILE,
    KVCacheInfo,
    MoEOffloadInfo,
    RunResult,
    TelemetryInfo,
    to_dict,
    write_results,
)
from llmbench.harness.run_repetitions import Repetitions, salt
from llmbench.harness.run_signals import RunInterrupted, StopSignals, signal_name
from llmbench.harness.run_summary import START_FILE, finish
from llmbench.harness.spec import RunSpec
from llmbench.harness.speculative_stats import format_speculative
from llmbench.harness.spread import metric_value
from llmbench.harness.telemetry import Telemetry
from llmbench.harness.telemetry import summarize as summarize_telemetry
from llmbench.harness.workloads import Session, Tokens, build_sessions, sessions_hash

NOT_FINISHED = "not finished: the run was under way when this was written"


def execute(
    spec: RunSpec,
    out_dir: Path | None,
    write_reports: Callable[[Path], object],
    *,
    is_strict: bool = False,
    shard: shards.Shard | None = None,
) -> Path:
    """Run the spec (every sweep point) and write the run folder; returns its path.

    `write_reports(folder)` renders the reports of a finished run or sweep folder (the reports
    layer sits above this one, so the caller hands it in). A signal ends the run with its
    results saved, then raises `RunInterrupted`; an engine crash likewise, then re-raises its
    `BackendFailure`; a folder that cannot be written is a `UserError` before any work. A run
    (or sweep point) whose measured requests all failed, or with `is_strict` more of them than
    `spec.max_failed_fraction`, raises `RunFailed` once everything is written. With `shard`,
    only that shard of the schedule runs (`--shard i/N`; `llmbench merge` joins the shards).
    """
    stamp = time.strftime("%Y%m%d-%H%M%S")
    root = out_dir or Path(spec.output_dir) / f"{spec.name}-{stamp}"
    prepare_folder(root)
    quality = None
    if spec.quality is not None:  # once per run, before the workload: every point shows it
        from llmbench.harness import quality as run_quality

        quality = run_quality.of_run(spec, lambda line: print(line, file=sys.stderr, flush=True))
    with StopSignals() as stop:
        if not spec.load.sweep:
            folder, verdict = _execute_point(
                spec, root, None, write_reports, stop, is_strict, shard, quality
            )
            if verdict is not None:
                raise failures.RunFailed(verdict)
            return folder
        verdicts = []
        try:
            for value in arrivals.sweep_points(list(spec.load.sweep)):
                folder = root / f"point-{value:g}"
                prepare_folder(folder)
                _, verdict = _execute_point(
                    spec, folder, value, write_reports, stop, is_strict, shard, quality
                )
                if verdict is not None:
                    verdicts.append(f"point-{value:g}: {verdict}")
        except (RunInterrupted, BackendFailure):
            if any(root.glob(f"point-*/{RESULTS_FILE}")):
                with stop.saving():
                    write_reports(root)
            raise
        with stop.saving():
            write_reports(root)
    if stop.signum is not None:
        raise RunInterrupted(stop.signum)
    if verdicts:
        raise failures.RunFailed("; ".join(verdicts))
    return root


def prepare_folder(folder: Path) -> None:
    """Create `folder` and check a file can be written in it, or raise a one-line `UserError`
    that names it (under a regular file, in /proc, read-only, no space...)."""
    probe = folder / ".llmbench-write-check"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe.write_text("ok")
        probe.unlink()
    except OSError as e:
        reason = e.strerror or type(e).__name__
        raise UserError(
            f"--out {folder}: cannot write there ({reason}); pass a folder you can write to"
        ) from None


def _execute_point(
    spec: RunSpec,
    folder: Path,
    point: float | None,
    write_reports: Callable[[Path], object],
    stop: StopSignals,
    is_strict: bool,
    shard: shards.Shard | None = None,
    quality: dict | None = None,
) -> tuple[Path, str | None]:
    """Run one point and write its folder; returns it and why the run fails (`RunFailed`),
    None when it does not. `shard`: run only that shard's sessions (a worker, `--shard`).
    `quality`: the run's `summary.quality` (`RunSpec.quality`), measured once by `execute`."""
    if spec.load.workers > 1 and shard is None:
        from llmbench.harness import run_workers

        return run_workers.execute_point(
            spec, folder, point, write_reports, stop, is_strict, quality
        )
    server_log = None  # the server's log, from here: its timings of this run's requests
    if spec.backend.server_log is not None:
        if shard is not None:
            raise UserError("backend.server_log: not read by a sharded run (--shard); drop it")
        server_log = ServerLog(spec.backend.server_log)
    backend, tokenizer, model_config = _open_backend(spec)
    measured = run_roofs.measured_roofs(spec, backend)
    roof_setup, cost_step = run_roofs.roofline_setup(spec, backend, model_config, measured)
    tokens = Tokens(tokenizer.encode, tokenizer.decode)
    workloads = [
        build_sessions(spec.workload, spec.seed, tokens, salt=salt(number))
        for number in range(1, spec.repeat + 1)
    ]
    warm_spec = replace(spec.workload, sessions=spec.warmup_requests)
    warmup = build_sessions(warm_spec, spec.seed, tokens, salt="warmup-")
    for stale in (RESULTS_FILE, START_FILE, EXPERTS_FILE):  # a reused folder: nothing left
        (folder / stale).unlink(missing_ok=True)
    log = RecordLog(folder, cost_step)
    if spec.backend.kind == "engine":
        backend.record_steps(log.step)
    options = DriveOptions(spec.backend.api == "chat", spec.temperature, spec.ignore_eos)
    # A mixture of experts: its routing statistics, snapshotted as each repetition starts.
    expert_log = snapshots_of(backend.engine, folder) if spec.backend.kind == "engine" else None
    on_start = expert_log.start_repetition if expert_log is not None else None
    own_workloads = [shards.pick(sessions, shard) for sessions in workloads]
    repetitions = Repetitions(backend, tokenizer, options, log, own_workloads, on_start)
    spec_dict = json.loads(json.dumps(spec.to_dict()))  # plain JSON values, as read back
    own_pids = (
        provenance.local_server_pids(spec.backend.url) if spec.backend.kind == "openai" else []
    )
    shared_tokens = None  # a server may hold a prefix cache from before the run: worth a check
    if spec.backend.kind == "openai":
        sent = [*warmup, *(session for sessions in workloads for session in sessions)]
        shared_tokens = run_warnings.first_turn_shared_tokens(sent, tokenizer)
    meter, client = None, None
    if spec.backend.kind == "openai":  # the client's own CPU: it may be the bottleneck
        meter = client_load.ClientMeter(own_pids)
        index, count = (shard.index, shard.count) if shard else (None, 1)
        client = client_load.start_block(index, count, shards.clock_anchor())
        if shard is not None:
            shard = replace(shard, start_at=meter.starting(shard.start_at))
    failure: BackendFailure | None = None
    with (
        provenance.LoadMonitor(own_pids=own_pids) as monitor,
        Telemetry(csv_path=folder / "telemetry.csv") as telemetry,
    ):
        start = RunResult(
            name=spec.name,
            interrupted=True,
            stop_reason=NOT_FINISHED,
            is_rebuilt=False,
            sweep_point=point,
            spec=spec_dict,
            provenance=replace(
                provenance.collect(
                    spec_dict,
                    spec.hash(),
                    sessions_hash(workloads[0]),
                    provenance.device_of(spec.backend.kind, backend, spec.backend.url),
                    monitor.load(),
                    measured,
                ),
                shared_prefix_tokens=shared_tokens,
                kv_cache=_kv_cache_info(backend) if spec.backend.kind == "engine" else None,
                quantize=_quantize_name(backend) if spec.backend.kind == "engine" else None,
                moe_offload=_moe_offload_info(backend) if spec.backend.kind == "engine" else None,
            ),
            summary={},
            roofline=roof_setup,
            telemetry=TelemetryInfo(telemetry.interval_s, tuple(telemetry.notes)),
            client=client,
        )
        try:
            asyncio.run(
                _drive(
                    repetitions,
                    backend,
                    spec,
                    shards.pick(warmup, shard),
                    point,
                    stop,
                    on_started=lambda: write_results(folder, start, START_FILE),
                    shard=shard,
                    meter=meter,
                )
            )
        except asyncio.CancelledError:
            if stop.signum is None:
                raise
        except RunInterrupted:
            pass  # a second signal during the workload: save what is there all the same
        except BackendFailure as e:
            failure = e
    with stop.saving():
        if spec.backend.kind == "engine":
            backend.record_steps(None)
        repetitions.close()
        if expert_log is not None:
            expert_log.write(repetitions.num_whole)
        records = repetitions.records
        points = None
        if spec.backend.kind == "openai" and roof_setup is not None:
            points = []
            for number in range(1, repetitions.num_started + 1):
                own = [r for r in records if r.repetition == number]
                for p in run_roofs.estimated_points(spec, model_config, own):
                    points.append({**p, "repetition": number})
                    log.point(points[-1])
        log.close()
        log_warnings: list[str] = []
        if server_log is not None:
            records, log_warnings = server_log.attach(records)
            rewrite_requests(folder, records)
        if stop.signum is not None:
            print("\ninterrupted: saving what was measured", file=sys.stderr)
            reason: str | None = signal_name(stop.signum)
        else:
            reason = None if failure is None else str(failure)
        result = finish(
            start,
            records,
            read_steps(folder) if points is None else points,
            repetitions.sessions,
            replace(
                start.telemetry,
                notes=tuple(telemetry.notes),
                summary=summarize_telemetry(telemetry.samples),
            ),
            monitor.load(),
            reason,
            num_repetitions=repetitions.num_started,
            num_whole_repetitions=repetitions.num_whole,
        )
        if log_warnings:
            warnings = [*result.summary["warnings"], *log_warnings]
            result = replace(result, summary={**result.summary, "warnings": warnings})
        if meter is not None:
            result = client_load.attach(result, meter.block(client))
        if quality is not None:  # `llmbench quality` of the run's configuration
            result = replace(result, summary={**result.summary, "quality": quality})
        write_results(folder, result)
        (folder / START_FILE).unlink(missing_ok=True)  # results.json has all it had
        print(format_summary(result), file=sys.stderr if point is not None else sys.stdout)
        write_reports(folder)
        print(folder, flush=True)
    if failure is not None:
        raise failure
    if stop.signum is not None:
        raise RunInterrupted(stop.signum)
    return folder, failures.failure_verdict(result.summary, spec.max_failed_fraction, is_strict)


def _open_backend(spec: RunSpec):
    """The backend, the client-side tokenizer (the model's own, for exact prompt counts) and
    the model's config (for the roofline)."""
    if spec.backend.kind == "engine":
        from llmbench.engine.engine import EngineConfig
        from llmbench.engine.kv_dtype import KVCacheDtype
        from llmbench.engine.speculative import SpeculativeConfig
        from llmbench.harness.backends.engine import EngineBackend
        from llmbench.harness.moe_offload import engine_offload

        e = spec.engine
        kv = e.kv_cache_dtype
        kv_cache_dtype = KVCacheDtype(kv, kv) if isinstance(kv, str) else KVCacheDtype(kv.k, kv.v)
        backend = EngineBackend(
            EngineConfig(
                model=spec.model,
                dtype=spec.dtype,
                device=spec.device,
                block_size=e.block_size,
                kv_cache_memory=e.kv_cache_memory,
                max_num_batched_tokens=e.max_num_batched_tokens,
                max_num_seqs=e.max_num_seqs,
                enable_prefix_caching=e.prefix_caching,
                num_threads=e.threads,
                kv_cache_dtype=kv_cache_dtype,
                quantize=e.quantize,
                speculative=SpeculativeConfig(
                    method=e.speculative.method,
                    num_tokens=e.speculative.num_tokens,
                    ngram_min=e.speculative.ngram_min,
                    ngram_max=e.speculative.ngram_max,
                    draft_model=e.speculative.draft_model,
                ),
                moe_offload=engine_offload(e.moe_offload, spec.device) if e.moe_offload else None,
            )
        )
        return backend, backend.engine.tokenizer, backend.engine.model_config
    if spec.backend.kind == "openai":
        from llmbench.engine.weights import open_weights
        from llmbench.harness.backends.openai import OpenAIBackend

        weights = open_weights(spec.model)
        tokenizer = weights.tokenizer()
        backend = OpenAIBackend(
            spec.backend.url,
            model=spec.backend.served_model,
            count_tokens=lambda text: len(tokenizer.encode(text)),
            timeout_s=spec.backend.timeout_s,
            headers=spec.backend.headers,
            request_id_header=spec.backend.request_id_header,
        )
        return backend, tokenizer, weights.config
    from llmbench.harness.backends.transformers import TransformersBackend

    backend = TransformersBackend(spec.model, spec.dtype, spec.engine.threads)
    return backend, backend.tokenizer, None


def _kv_cache_info(backend) -> KVCacheInfo:
    """The engine's K/V cache as the run uses it: formats, real bytes per token, tokens held."""
    kv = backend.engine.kv_cache
    return KVCacheInfo(
        kv.kv_dtype.k, kv.kv_dtype.v, kv.bytes_per_token, kv.num_tokens, kv.num_bytes
    )


def _moe_offload_info(backend) -> MoEOffloadInfo | None:
    """The engine's expert offloading as it runs (None: every expert resident)."""
    offload = backend.engine.expert_offload
    if offload is None:
        return None
    c = offload.config
    return MoEOffloadInfo(
        c.num_resident,
        c.num_cached,
        c.is_simulated,
        c.link_bytes_per_s,
        c.sleep,
        offload.expert_bytes,
        c.usage_profile,
    )


def _quantize_name(backend) -> str | None:
    """The engine's weight quantization as `parse_quantize` reads it back (None: none)."""
    scheme = backend.engine.quantize
    return None if scheme is None else scheme.name


async def _drive(
    repetitions: Repetitions,
    backend,
    spec: RunSpec,
    warmup: list[Session],
    point: float | None,
    stop: StopSignals,
    on_started: Callable[[], object],
    shard: shards.Shard | None = None,
    meter: client_load.ClientMeter | None = None,
) -> None:
    stop.attach()
    try:
        try:
            await backend.start()
        except Exception as e:  # noqa: BLE001 — e.g. an unreachable server: the user's to fix
            raise UserError(f"backend {spec.backend.kind}: {e}") from None
        on_started()
        await repetitions.warm_up(warmup)

        def measure(driver: Driver, sessions: list[Session]):
            work = _measure(driver, spec, sessions, point, shard)
            return work if meter is None else meter.measure(work)

        await repetitions.run(measure)
    finally:
        try:
            await backend.close()
        finally:
            stop.drive_ended()


async def _measure(
    driver: Driver,
    spec: RunSpec,
    sessions: list[Session],
    point: float | None,
    shard: shards.Shard | None = None,
):
    """One repetition of the workload under the spec's load pattern (or the sweep's `point`).

    A shard's `sessions` are its own; its arrivals are theirs in the whole schedule, its closed
    loop its share of the concurrency (`shards`)."""
    load = spec.load
    start_at = shard.start_at if shard is not None else None
    if load.kind == "concurrency":
        concurrency = shards.concurrency_of(int(point or load.concurrency), shard)
        await driver.run_closed_loop(sessions, concurrency, start_at)
        return
    rate = point or load.rate_per_s
    n = spec.workload.sessions  # the whole schedule's sessions
    if load.kind == "constant":
        offsets = arrivals.constant_offsets(rate, n)
    elif load.kind == "poisson":
        offsets = arrivals.poisson_offsets(rate, n, spec.seed)
    elif load.kind == "gamma":
        offsets = arrivals.gamma_offsets(rate, load.burstiness, n, spec.seed)
    else:
        offsets = arrivals.trace_offsets(Path(load.trace))[:n]
    offsets = shards.pick(offsets, shard)
    sessions = sessions[: len(offsets)]  # a trace shorter than the workload
    await driver.run_open_loop(sessions, offsets, start_at)


def format_summary(result: RunResult) -> str:
    """The table printed after a run (also what `report.md` will start from)."""
    s = result.summary
    header = (
        f"{result.name}: {summary_lines.what_ran(to_dict(result))} - {s['num_completed']} requests "
        f"completed, {s['num_failed']} failed in {s['duration_s'] or 0:.1f} s"
    )
    lines = [
        header,
        f"{'':<10}{'mean':>10}{'p50':>10}{'p90':>10}{'p99':>10}{'max':>10}",
    ]
    for name in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms", "queue_ms"):
        d = s[name]
        cells = "".join(
            f"{d[k]:>10.1f}" if d[k] is not None else f"{'-':>10}"
            for k in ("mean", "p50", "p90", "p99", "max")
        )
        lines.append(f"{name:<10}{cells}")
    hit = s.get("prefix_cache_hit_rate")
    lines.append(
        f"throughput: {_rate(s['output_tok_per_s'], '.1f')} output tok/s, "
        f"{_rate(s['input_tok_per_s'], '.1f')} input tok/s, {_rate(s['request_per_s'], '.2f')} "
        f"req/s; goodput {_rate(s['goodput_request_per_s'], '.2f')} req/s; "
        f"prefix-cache hit rate {'-' if hit is None else f'{hit:.2f}'}"
    )
    lines += summary_lines.server_client_lines(s)
    roof = result.roofline
    estimated = ""
    if roof is not None and roof.is_estimated:
        guess = f"; bytes assume {roof.dtype} weights: set backend.weights"
        estimated = f" (estimated from the client{'' if roof.weights else guess})"
    if roof is not None and roof.roofs is not None:
        r = roof.roofs
        mbu, mfu = s.get("decode_mbu"), s.get("prefill_mfu")
        flops = "-" if r.flops_per_s is None else f"{r.flops_per_s / 1e9:.0f}"
        lines.append(
            f"roofline{estimated}: decode MBU {'-' if mbu is None else f'{mbu:.2f}'}, prefill MFU "
            f"{'-' if mfu is None else f'{mfu:.2f}'} against {r.label} "
            f"({r.read_bytes_per_s / 1e9:.1f} GB/s, {flops} GFLOP/s {roof.dtype})"
        )
    elif roof is not None and "decode" in roof.phases:
        lines.append(
            f"roofline{estimated}: decode at {roof.phases['decode'].bytes_per_s / 1e9:.2f} "
            "GB/s achieved (set backend.hardware for MBU/MFU)"
        )
    sessions = s.get("sessions", {})
    if sessions.get("num_sessions"):
        lines.append(
            f"sessions: {sessions['num_sessions']}, mean {sessions['mean_session_s']:.1f} s "
            f"(waiting on the model {sessions['mean_model_wait_s']:.1f} s, on tools "
            f"{sessions['mean_tool_wait_s']:.1f} s)"
        )
    client = client_load.summary_line(result.client)
    if client is not None:
        lines.append(client)
    if s.get("speculative"):
        lines.append(format_speculative(s["speculative"]))
    repetitions = format_repetitions(result)
    if repetitions:
        lines.append(repetitions)
    if result.interrupted:
        lines.append(f"interrupted ({result.stop_reason}): partial results")
    lines += summary_lines.warning_lines(s)
    return "\n".join(lines)


# The spread the summary table shows: (metric, label).
SHOWN_SPREAD = (
    ("tpot_ms.p50", "TPOT p50"),
    ("decode_mbu", "decode MBU"),
    ("output_tok_per_s", "output tok/s"),
)


def format_repetitions(result: RunResult) -> str | None:
    """The summary table's line on repetitions: how many, and the between-repetition cv of a
    few metrics ("3 repetitions: TPOT p50 cv 2.1%, ..."); which ones a stop cut short. None for
    a run of one repetition."""
    s = result.summary
    repetitions = s.get("repetitions") or []
    asked = result.spec.get("repeat", 1)
    if asked <= 1 and len(repetitions) <= 1:
        return None
    spread = s.get("spread") or {}
    cvs = []
    for name, label in SHOWN_SPREAD:
        cv = (spread.get(name) or {}).get("cv")
        if cv is not None or metric_value(s, name) is not None:
            cvs.append(f"{label} cv {'-' if cv is None else f'{cv:.1%}'}")
    partial = [r["repetition"] for r in repetitions if r["is_partial"]]
    if not partial:
        return f"{len(repetitions)} repetitions: " + ", ".join(cvs)
    whole = len(repetitions) - len(partial)
    return (
        f"repetitions: {whole} whole, repetition {partial[0]} of {asked} cut short (its numbers "
        f"are partial); spread over the whole ones: " + ", ".join(cvs)
    )


def _rate(value: float | None, spec: str) -> str:
    """A rate as the table shows it: "-" when there is none (nothing completed)."""
    return "-" if value is None else format(value, spec)
