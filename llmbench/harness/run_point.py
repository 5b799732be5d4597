"""One run point in this process: backend opened, roofs settled, workload driven, results written.

The order keeps every measurement: the hardware roofs are measured (or read from the cache)
before the workload, with a progress line; `run-start.json` is written before the first request
and each record is appended as it completes (`record_log`); a signal stops the workload and the
point saves what it measured (`run_signals`); an engine crash ends it the same way, then
re-raises. A write that fails (a full disk: a record, run-start.json, telemetry.csv) stops it
too: every record is in memory, so the summary counts them all; results.json is written if it
still fits, the reports are left to `llmbench report`, and a `WriteFailed` says what is on disk.
Before each slow step (building the workload) a line on stderr says what is happening. The
warm-up runs once and the measured phase `spec.repeat` times (`run_repetitions`). `run` calls
it for each point of a sweep; a worker process (`worker`) for its shard.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import Callable, Iterator
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
)
from llmbench.harness.backends.server_log import ServerLog
from llmbench.harness.driver import DriveOptions, Driver
from llmbench.harness.engine_config import engine_config
from llmbench.harness.expert_stats_file import EXPERTS_FILE, snapshots_of
from llmbench.harness.record_log import (
    REQUESTS_FILE,
    SESSIONS_FILE,
    STEPS_FILE,
    RecordLog,
    read_steps,
    rewrite_requests,
)
from llmbench.harness.results import (
    RESULTS_FILE,
    KVCacheInfo,
    MoEOffloadInfo,
    RunResult,
    TelemetryInfo,
    write_results,
)
from llmbench.harness.run_folder import WriteFailed, write_failed
from llmbench.harness.run_repetitions import Repetitions, salt
from llmbench.harness.run_signals import RunInterrupted, StopSignals, signal_name
from llmbench.harness.run_summary import START_FILE, finish
from llmbench.harness.spec import RunSpec
from llmbench.harness.summary_lines import format_summary
from llmbench.harness.telemetry import Telemetry
from llmbench.harness.telemetry import summarize as summarize_telemetry
from llmbench.harness.workloads import Session, Tokens, build_sessions, sessions_hash

NOT_FINISHED = "not finished: the run was under way when this was written"


def execute_point(
    spec: RunSpec,
    folder: Path,
    point: float | None,
    write_reports: Callable[[Path], object],
    stop: StopSignals,
    is_strict: bool,
    shard: shards.Shard | None = None,
    quality: dict | None = None,
) -> tuple[Path, str | None]:
    """Run one point in this process and write its folder; returns it and why the run fails
    (`RunFailed`), None when it does not. `shard`: run only that shard's sessions (a worker,
    `--shard`). `quality`: the run's `summary.quality` (`RunSpec.quality`), measured once by
    `run.execute`."""
    server_log = None  # the server's log, from here: its timings of this run's requests
    if spec.backend.server_log is not None:
        if shard is not None:
            raise UserError("backend.server_log: not read by a sharded run (--shard); drop it")
        server_log = ServerLog(spec.backend.server_log)
    backend, tokenizer, model_config = _open_backend(spec)
    measured = run_roofs.measured_roofs(spec, backend)
    roof_setup, cost_step = run_roofs.roofline_setup(spec, backend, model_config, measured)
    tokens = Tokens(tokenizer.encode, tokenizer.decode)
    say(f"preparing the workload: {workload_size(spec)}")
    workloads = [
        build_sessions(spec.workload, spec.seed, tokens, salt=salt(number))
        for number in range(1, spec.repeat + 1)
    ]
    warm_spec = replace(spec.workload, sessions=spec.warmup_requests)
    warmup = build_sessions(warm_spec, spec.seed, tokens, salt="warmup-")
    for stale in (RESULTS_FILE, START_FILE, EXPERTS_FILE):  # a reused folder: nothing left
        (folder / stale).unlink(missing_ok=True)
    log = RecordLog(folder, cost_step, on_error=stop.fail)  # a failed write stops the run
    if spec.backend.kind == "engine":
        backend.record_steps(log.step)
    options = DriveOptions(spec.backend.api == "chat", spec.temperature, spec.ignore_eos)
    # A mixture of experts: its routing statistics, snapshotted as each repetition starts.
    expert_log = snapshots_of(backend.engine, folder) if spec.backend.kind == "engine" else None
    on_start = None
    if expert_log is not None:

        def on_start(number: int) -> None:
            try:
                expert_log.start_repetition(number)
            except OSError as e:  # its snapshot: a full disk stops the run as a record's does
                stop.fail(write_failed(folder / EXPERTS_FILE, e))

    own_workloads = [shards.pick(sessions, shard) for sessions in workloads]
    reset = None
    if spec.backend.reset_prefix_cache:

        async def reset() -> None:
            try:
                await backend.reset_prefix_cache()
            except Exception as e:  # noqa: BLE001 — e.g. a server without the endpoint
                raise UserError(f"backend.reset_prefix_cache: {e}") from None

    repetitions = Repetitions(backend, tokenizer, options, log, own_workloads, on_start, reset)
    spec_dict = spec.to_dict()  # plain JSON values, as read back
    own_pids = provenance.local_server_pids(*spec.backend.addresses)
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
            started = meter.starting(shard.start_at, shard.agreed_start_unix_s)
            shard = replace(shard, start_at=started)
    failure: BackendFailure | None = None
    with (
        provenance.LoadMonitor(own_pids=own_pids) as monitor,
        _telemetry(folder / "telemetry.csv", stop) as telemetry,
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
                    provenance.device_of(
                        spec.backend.kind,
                        backend,
                        ", ".join(spec.backend.addresses) or None,
                        spec.backend.hardware,
                    ),
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
            if stop.signum is None and stop.failed_write is None:
                raise
        except RunInterrupted:
            pass  # a second signal during the workload: save what is there all the same
        except BackendFailure as e:
            failure = e
        except WriteFailed as e:  # run-start.json
            stop.fail(e)
    with stop.saving(folder, "results.json and the reports"):
        if spec.backend.kind == "engine":
            backend.record_steps(None)
        repetitions.close()
        if expert_log is not None:
            try:
                expert_log.write(repetitions.num_whole)
            except OSError as e:
                stop.fail(write_failed(folder / EXPERTS_FILE, e))
        records = repetitions.records
        points = None
        if spec.backend.kind == "openai" and roof_setup is not None:
            points = []
            for number in range(1, repetitions.num_started + 1):
                own = [r for r in records if r.repetition == number]
                for p in run_roofs.estimated_points(spec, model_config, own, roof_setup):
                    points.append({**p, "repetition": number})
                    log.point(points[-1])
        try:
            log.close()
        except WriteFailed:
            pass  # stop.failed_write has it; the lines not written are in log.unwritten
        log_warnings: list[str] = []
        if server_log is not None:
            records, log_warnings = server_log.attach(records)
            try:
                rewrite_requests(folder, records)
            except WriteFailed as e:
                stop.fail(e)
        if stop.signum is not None:
            print("\ninterrupted: saving what was measured", file=sys.stderr)
            reason: str | None = signal_name(stop.signum)
        elif failure is not None:
            reason = str(failure)
        elif stop.failed_write is not None:
            reason = f"writing {stop.failed_write.path} failed: {stop.failed_write.reason}"
        else:
            reason = None
        if points is None:  # the steps on disk, and those a failed write kept in memory
            points = [*read_steps(folder), *log.unwritten[STEPS_FILE]]
        result = finish(
            start,
            records,
            points,
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
        is_written = False
        try:
            write_results(folder, result)
            is_written = True
            (folder / START_FILE).unlink(missing_ok=True)  # results.json has all it had
        except WriteFailed as e:
            stop.fail(e)
        stop.left_to_save("the reports")
        print(format_summary(result), file=sys.stderr if point is not None else sys.stdout)
        if stop.failed_write is None:  # else the disk is full: `llmbench report` later
            try:
                write_reports(folder)
            except OSError as e:  # the disk filled up with the figures
                path = Path(e.filename) if e.filename else folder / "report.html"
                stop.fail(write_failed(path, e))
        print(folder, flush=True)
    if failure is not None:
        raise failure
    if stop.failed_write is not None:
        kept = _what_was_kept(folder, log, is_written, stop.failed_write.fix)
        raise stop.failed_write.with_outcome(kept)
    if stop.signum is not None:
        raise RunInterrupted(stop.signum)
    return folder, failures.failure_verdict(result.summary, spec.max_failed_fraction, is_strict)


def say(line: str) -> None:
    """A progress line on stderr, out at once: what the run is doing (before each slow step)."""
    print(line, file=sys.stderr, flush=True)


def workload_size(spec: RunSpec) -> str:
    """What the workload expands to, for the line before it is built: `4 rag sessions and 1
    warm-up` (`2 repetitions of 4 rag sessions, and 1 warm-up` with `repeat`)."""
    sessions = f"{spec.workload.sessions:,} {spec.workload.kind} sessions"
    if spec.repeat > 1:
        sessions = f"{spec.repeat} repetitions of {sessions},"
    return f"{sessions} and {spec.warmup_requests:,} warm-up"


@contextlib.contextmanager
def _telemetry(path: Path, stop: StopSignals) -> Iterator[Telemetry]:
    """Telemetry sampled into the CSV at `path`; a write of it that fails stops the run as a
    record's does (`StopSignals.fail`)."""
    telemetry = Telemetry(csv_path=path)
    try:
        telemetry.__enter__()
    except OSError as e:
        raise write_failed(path, e) from None
    try:
        yield telemetry
    finally:
        try:
            telemetry.__exit__(None, None, None)
        except OSError as e:  # closing flushes the last rows
            stop.fail(write_failed(path, e))


def _what_was_kept(folder: Path, log: RecordLog, is_results_written: bool, fix: str) -> str:
    """How a run stopped by a failed write ends its line: the records on disk, results.json,
    and what to do."""
    counts = []
    for name, what in (
        (REQUESTS_FILE, "request"),
        (STEPS_FILE, "step"),
        (SESSIONS_FILE, "session"),
    ):
        total = log.num_written[name] + len(log.unwritten[name])
        if total:
            counts.append(f"{log.num_written[name]:,} of {total:,} {what} records")
    kept = f"on disk {', '.join(counts)}" if counts else "no record made"
    then = f"{fix}, then llmbench report {folder}"
    if is_results_written:
        return f"the run stopped; {kept}; results.json written; {then} writes the reports"
    if (folder / START_FILE).is_file():
        return (
            f"the run stopped; {kept}; results.json not written (the summary above counts "
            f"every record); {then} rebuilds it from the records on disk"
        )
    return f"the run stopped; {kept}; results.json not written; {fix} and run again"


def _open_backend(spec: RunSpec):
    """The backend, the client-side tokenizer (the model's own, for exact prompt counts) and
    the model's config (for the roofline)."""
    if spec.backend.kind == "engine":
        from llmbench.harness.backends.engine import EngineBackend

        config = engine_config(spec.model, spec.dtype, spec.device, spec.engine, run=spec)
        backend = EngineBackend(config)
        return backend, backend.engine.tokenizer, backend.engine.model_config
    if spec.backend.kind == "openai":
        from llmbench.engine.weights import open_weights
        from llmbench.harness.backends.openai import OpenAIBackend

        weights = open_weights(spec.model)
        tokenizer = weights.tokenizer()
        servers = [
            OpenAIBackend(
                url,
                model=spec.backend.served_model,
                count_tokens=lambda text: len(tokenizer.encode(text)),
                timeout_s=spec.backend.timeout_s,
                headers=spec.backend.headers,
                request_id_header=spec.backend.request_id_header,
            )
            for url in spec.backend.addresses
        ]
        if not spec.backend.urls:
            return servers[0], tokenizer, weights.config
        from llmbench.harness.backends.routed import RoutedBackend
        from llmbench.harness.routing import make_policy

        routing = spec.routing
        policy = make_policy(
            routing.policy, routing.block_tokens, routing.max_imbalance, routing.min_match
        )
        return RoutedBackend(servers, policy, routing.down_s), tokenizer, weights.config
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
    offload = backend.engine.moe_offload
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
        for line in getattr(backend, "unreachable_at_start", ()):  # a routed backend's
            print(f"note: endpoint {line}; skipped for now, tried again later", file=sys.stderr)
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
        offsets = arrivals.trace_offsets(Path(load.trace), max_requests=n)
    offsets = shards.pick(offsets, shard)
    sessions = sessions[: len(offsets)]  # a trace shorter than the workload
    await driver.run_open_loop(sessions, offsets, start_at)
