"""`llmbench run`: the output folder checked, then every point of the spec's sweep (one when it
has no sweep; `load.search`'s points one after another, each load chosen from how the ones
before met the SLOs: `capacity`), each in this process (`run_point`) or in worker processes
(`run_workers`).

The folder is claimed and checked before anything slow (`run_folder`: one that holds a run
already is refused unless `force`); `llmbench quality` of the run's configuration is measured
once, before the workload, so every point shows it. Each slow step is announced by a line on
stderr before it starts (loading the model, preparing the workload), so a run says what it is
doing within moments of its start. A signal or an engine crash ends the sweep with the finished
points' reports written; a write that fails (a full disk) ends it at once (`WriteFailed`).
Each point prints its summary (on stderr for a sweep's points) and its folder; a sweep ends with
its own report (`write_sweep_report`: a table of the points, then the sweep folder, the last
line).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

from llmbench.errors import BackendFailure
from llmbench.harness import arrivals, capacity, failures, run_point, run_workers, shards
from llmbench.harness.results import RESULTS_FILE, read_results
from llmbench.harness.run_folder import (
    claim_folder,
    default_folder,
    prepare_folder,
    removed_if_left_empty,
)
from llmbench.harness.run_point import say
from llmbench.harness.run_signals import RunInterrupted, StopSignals
from llmbench.harness.spec import RunSpec
from llmbench.harness.sweep_folders import point_folders, point_name


def execute(
    spec: RunSpec,
    out_dir: Path | None,
    write_reports: Callable[[Path], object],
    *,
    is_strict: bool = False,
    shard: shards.Shard | None = None,
    write_sweep_report: Callable[[Path], object] | None = None,
    force: bool = False,
) -> Path:
    """Run the spec (every sweep point) and write the run folder; returns its path.

    `write_reports(folder)` renders the reports of a finished run or sweep point (the reports
    layer sits above this one, so the caller hands it in); `write_sweep_report(root)` those of
    the sweep folder once its points are done (or stopped), and prints what the caller wants
    printed (default: `write_reports`). A signal ends the run with its results saved, then
    raises `RunInterrupted`; an engine crash likewise, then re-raises its `BackendFailure`; a
    write that fails (a full disk) stops it, keeps what it can and raises `WriteFailed`. A
    folder that cannot be written, or that holds a run already (unless `force`: that run's files
    are removed), is a `UserError` before any work; a folder the run made is removed again if
    it fails having written nothing (`removed_if_left_empty`). A run (or sweep point)
    whose measured requests all failed, or with `is_strict` more of them than
    `spec.max_failed_fraction`, raises `RunFailed` once everything is written. With `shard`,
    only that shard of the schedule runs (`--shard i/N`; `llmbench merge` joins the shards).
    """
    root = out_dir or default_folder(spec.output_dir, spec.name)
    with removed_if_left_empty(root):
        claim_folder(root, force=force)
        return _execute_claimed(spec, root, write_reports, is_strict, shard, write_sweep_report)


def _execute_claimed(
    spec: RunSpec,
    root: Path,
    write_reports: Callable[[Path], object],
    is_strict: bool,
    shard: shards.Shard | None,
    write_sweep_report: Callable[[Path], object] | None,
) -> Path:
    """`execute` in the folder it claimed: the quality score, then the point or the sweep."""
    quality = None
    if spec.quality is not None:  # once per run, before the workload: every point shows it
        from llmbench.harness import quality as run_quality

        say(f"quality: scoring {spec.model} as the run configures it, before the workload")
        quality = run_quality.of_run(spec, say)
    with StopSignals() as stop:
        if not spec.load.sweep and spec.load.search is None:
            folder, verdict = _execute_point(
                spec, root, None, write_reports, stop, is_strict, shard, quality
            )
            if verdict is not None:
                raise failures.RunFailed(verdict)
            return folder
        verdicts = []
        try:
            for value in _sweep_loads(spec, root):
                folder = root / point_name(value)
                prepare_folder(folder)
                _, verdict = _execute_point(
                    spec, folder, value, write_reports, stop, is_strict, shard, quality
                )
                if verdict is not None:
                    verdicts.append(f"{folder.name}: {verdict}")
        except (RunInterrupted, BackendFailure):
            if any((p / RESULTS_FILE).is_file() for p in point_folders(root)):
                with stop.saving(root, "the sweep's reports"):
                    (write_sweep_report or write_reports)(root)
            raise
        with stop.saving(root, "the sweep's reports"):
            (write_sweep_report or write_reports)(root)
    if stop.signum is not None:
        raise RunInterrupted(stop.signum)
    if verdicts:
        raise failures.RunFailed("; ".join(verdicts))
    return root


def _sweep_loads(spec: RunSpec, root: Path) -> Iterator[float]:
    """The loads of a sweep's points in the order they run: `load.sweep`'s, ascending; or
    `load.search`'s, each chosen once the point before it has written its results."""
    if spec.load.sweep:
        yield from arrivals.sweep_points(list(spec.load.sweep))
        return
    search, met = spec.load.search, {}
    whole = spec.load.kind == "concurrency"
    while (value := capacity.next_load(search, met, whole)) is not None:
        yield value
        summary = read_results(root / point_name(value)).summary
        met[value] = capacity.meets_slos(summary)
        share = summary.get("goodput_fraction")
        shown = "no measured request" if share is None else f"{share:.0%} of its requests"
        verdict = "met" if met[value] else "missed"
        say(f"search: {point_name(value)} {verdict} the SLOs ({shown})")


def _execute_point(
    spec: RunSpec,
    folder: Path,
    point: float | None,
    write_reports: Callable[[Path], object],
    stop: StopSignals,
    is_strict: bool,
    shard: shards.Shard | None,
    quality: dict | None,
) -> tuple[Path, str | None]:
    """One point, in worker processes when the load asks for several (and this is no shard)."""
    say(f"{'' if point is None else f'{point_name(point)}: '}loading {_what_loads(spec)}")
    if spec.load.workers > 1 and shard is None:
        return run_workers.execute_point(
            spec, folder, point, write_reports, stop, is_strict, quality
        )
    return run_point.execute_point(
        spec, folder, point, write_reports, stop, is_strict, shard, quality
    )


def _what_loads(spec: RunSpec) -> str:
    """What a point opens before its roofs and workload: `synthetic:tiny (engine, float32,
    device auto)`, `the tokenizer of smollm2-135m (openai at http://...)`."""
    kind = spec.backend.kind
    if kind == "openai":
        return f"the tokenizer of {spec.model} (openai at {', '.join(spec.backend.addresses)})"
    device = f", device {spec.device}" if kind == "engine" else ""
    return f"{spec.model} ({kind}, {spec.dtype}{device})"
