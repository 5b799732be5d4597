"""`load.workers: N`: one run point sent by N client processes, merged into one run folder.

One asyncio process reads every stream on one core, and past about 29,000 chunks/s here it is
the bottleneck. So the parent starts N workers (`python -m llmbench.harness.worker`), each
running shard i of N (`shards`) into `<folder>/shards/shard-<i>/` with its own records, log and
telemetry; before each repetition it waits until every worker has prepared its first requests,
then gives them one start on CLOCK_MONOTONIC a few milliseconds ahead, so every session is
scheduled when the single process would schedule it. When they are done it merges the shards
into the point's folder (`merge`), on its own clock, with the machine's load and telemetry it
watched for the whole run, and renders the reports.

Signals: the workers run in their own sessions (a terminal's Ctrl-C reaches the parent only),
and the parent passes every signal on, so each worker stops once and saves what it measured;
the parent then merges the partial shards. If the parent is killed, `llmbench merge
<folder>/shards/shard-* --out <folder>` makes the run folder from the shards.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from llmbench.errors import UserError
from llmbench.harness import failures, merge, provenance, run_roofs, shards
from llmbench.harness.results import RESULTS_FILE, TelemetryInfo, write_results
from llmbench.harness.run_folder import prepare_folder
from llmbench.harness.run_signals import RunInterrupted, StopSignals
from llmbench.harness.run_summary import START_FILE
from llmbench.harness.spec import RunSpec
from llmbench.harness.summary_lines import format_summary
from llmbench.harness.telemetry import Telemetry
from llmbench.harness.telemetry import summarize as summarize_telemetry
from llmbench.harness.worker import JOB_FILE, LOG_FILE

START_LEAD_NS = 20_000_000  # the common start is this far ahead of the last worker's "ready"


def shard_folders(folder: Path, count: int) -> list[Path]:
    return [folder / "shards" / f"shard-{i}" for i in range(count)]


@dataclass
class _Worker:
    index: int
    process: subprocess.Popen
    buffer: bytes = b""
    is_open: bool = True  # its stdout has not ended
    is_ready: bool = False  # waiting for the start of the next repetition
    end: dict = field(default_factory=dict)  # its last message: done, interrupted, error


def execute_point(
    spec: RunSpec,
    folder: Path,
    point: float | None,
    write_reports: Callable[[Path], object],
    stop: StopSignals,
    is_strict: bool,
    quality: dict | None = None,
) -> tuple[Path, str | None]:
    """Run one point with `spec.load.workers` processes and write its merged folder; returns
    it and why the run fails (`failures.RunFailed`), None when it does not. `quality`: the
    run's `summary.quality`, as `run.execute` measured it."""
    from llmbench.engine.weights import open_weights

    count = spec.load.workers
    model_config = open_weights(spec.model).config  # the merged roofline's shapes
    run_roofs.measured_roofs(spec, None)  # once, into the cache the workers then read
    folders = shard_folders(folder, count)
    for shard_folder in folders:
        prepare_folder(shard_folder)
    for stale in (RESULTS_FILE, START_FILE):
        (folder / stale).unlink(missing_ok=True)
    target = shards.clock_anchor()
    print(
        f"load.workers: {count} client processes (logs: {folder / 'shards'}/shard-*/{LOG_FILE})",
        file=sys.stderr,
        flush=True,
    )
    server_pids = provenance.local_server_pids(*spec.backend.addresses)
    with (
        provenance.LoadMonitor(own_pids=server_pids) as monitor,
        Telemetry(csv_path=folder / "telemetry.csv") as telemetry,
    ):
        workers = _start(spec, folders, point)
        _coordinate(workers, stop)
    with stop.saving():
        errors = [w for w in workers if w.end.get("event") == "error"]
        if errors:
            w = errors[0]
            raise UserError(f"worker {w.index} of {count}: {w.end['message']}")
        info = TelemetryInfo(
            telemetry.interval_s,
            (
                *telemetry.notes,
                "process columns: the parent's; each worker's are in shards/shard-<i>",
            ),
            summarize_telemetry(telemetry.samples),
        )
        result = merge.merge(
            folders,
            folder,
            target=target,
            load=monitor.load(),
            telemetry=info,
            model_config=model_config,
        )
        if quality is not None:
            result = replace(result, summary={**result.summary, "quality": quality})
            write_results(folder, result)
        print(format_summary(result), file=sys.stderr if point is not None else sys.stdout)
        write_reports(folder)
        print(folder, flush=True)
    if stop.signum is not None:
        raise RunInterrupted(stop.signum)
    return folder, failures.failure_verdict(result.summary, spec.max_failed_fraction, is_strict)


def _start(spec: RunSpec, folders: list[Path], point: float | None) -> list[_Worker]:
    spec_dict = spec.to_dict()
    workers = []
    for index, shard_folder in enumerate(folders):
        job = {"spec": spec_dict, "point": point, "index": index, "count": len(folders)}
        (shard_folder / JOB_FILE).write_text(json.dumps(job, indent=1) + "\n")
        with (shard_folder / LOG_FILE).open("w") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", "llmbench.harness.worker", str(shard_folder)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                start_new_session=True,  # signals come from the parent only, once
            )
        workers.append(_Worker(index, process))
    return workers


def _coordinate(workers: list[_Worker], stop: StopSignals) -> None:
    """Read the workers' messages until all have ended: start each repetition together, pass
    signals on, stop the others when one fails."""
    selector = selectors.DefaultSelector()
    for w in workers:
        selector.register(w.process.stdout, selectors.EVENT_READ, w)
    while any(w.is_open for w in workers):
        try:
            events = selector.select()
        except RunInterrupted as e:
            _signal_all(workers, e.signum)
            continue
        for key, _ in events:
            w = key.data
            chunk = os.read(key.fileobj.fileno(), 65536)
            if not chunk:
                w.is_open = False
                selector.unregister(key.fileobj)
                continue
            w.buffer += chunk
            while b"\n" in w.buffer:
                line, _, w.buffer = w.buffer.partition(b"\n")
                message = json.loads(line)
                if message["event"] == "ready":
                    w.is_ready = True
                else:
                    w.end = message
                    if message["event"] == "error":
                        _signal_all(workers, 15)  # SIGTERM: the others stop and save
        _release(workers)
    selector.close()
    for w in workers:
        with contextlib.suppress(OSError):
            w.process.stdin.close()
        w.process.wait()
    silent = [w for w in workers if not w.end]
    if silent and stop.signum is None:  # a signal may have killed one before it could say so
        w = silent[0]
        raise UserError(
            f"worker {w.index} of {len(workers)} ended (exit {w.process.returncode}) without "
            f"finishing; see shards/shard-{w.index}/{LOG_FILE}"
        )


def _release(workers: list[_Worker]) -> None:
    """When every worker still running waits for a start, give them one."""
    running = [w for w in workers if w.is_open]
    if not running or not all(w.is_ready for w in running):
        return
    message = json.dumps({"start_monotonic_ns": time.monotonic_ns() + START_LEAD_NS}) + "\n"
    for w in running:
        w.is_ready = False
        with contextlib.suppress(OSError):  # it has just died: its stdout will end
            w.process.stdin.write(message.encode())
            w.process.stdin.flush()


def _signal_all(workers: list[_Worker], signum: int) -> None:
    for w in workers:
        if w.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                w.process.send_signal(signum)
