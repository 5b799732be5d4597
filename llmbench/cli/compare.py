"""`llmbench compare BASE NEW`: the gates judged on two runs (or sweeps), for people and for CI;
exit 0 pass, 1 regression, 2 unusable input. `llmbench compare --history DIR`: where each gated
metric shifted over a folder of runs, exit 1 when the last shift is a regression past a gate."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from llmbench.cli.options import check_file_option, verdict_options
from llmbench.errors import UserError

if TYPE_CHECKING:  # the harness is imported when the command runs
    from llmbench.compare.gates import Gate
    from llmbench.compare.runs import RunPair
    from llmbench.compare.verdict import Comparison

STEP_SUMMARY_ENV = "GITHUB_STEP_SUMMARY"  # GitHub Actions shows the Markdown appended here


@click.command()
@click.argument("baseline", metavar="[BASE", type=click.Path(path_type=Path), required=False)
@click.argument("new", metavar="NEW]", type=click.Path(path_type=Path), required=False)
@click.option(
    "--history",
    "history_path",
    type=click.Path(path_type=Path),
    default=None,
    help="instead of BASE NEW: a folder of run folders of one spec (oldest first by start "
    "time); names the run where each gated metric shifted (E-Divisive means)",
)
@click.option(
    "--gates",
    "gates_path",
    type=click.Path(path_type=Path),
    default=None,
    help="gates YAML, e.g. `tpot_ms.p50: {max_increase: 5%}` (default: the shipped gates "
    "for the runs' backend: hardware-normalised for the engine, plus raw latency on one "
    "device; latency, throughput and failures for a server)",
)
@verdict_options
@click.option("--force", is_flag=True, help="compare runs of different benchmarks anyway")
@click.option(
    "--seed", type=int, default=0, show_default=True, help="bootstrap (--history: permutation) seed"
)
def compare(
    baseline: Path | None,
    new: Path | None,
    history_path: Path | None,
    gates_path: Path | None,
    fmt: str,
    junit_path: Path | None,
    html_path: Path | None,
    force: bool,
    allow_busy: bool,
    force_devices: bool,
    allow_missing: bool,
    seed: int,
) -> None:
    """Compare NEW against BASE on every gate: change, 95% bootstrap interval, verdict.

    BASE and NEW are run folders, sweep folders (compared point by point) or results.json files.
    A gate fails only when the whole interval lies past its threshold; a rate or roofline
    fraction from a side of one repetition has no interval and is judged on its change. Exit 0:
    no regression; 1: a regression (each failing gate explained under the table, or on stderr
    with --format markdown / json); 2: unusable input (missing or corrupt files, an unknown
    schema version, runs of different benchmarks without --force) or no verdict (a gate refused
    or without data, each named on stderr, unless --allow-missing). A regression measured on a
    busy machine is inconclusive unless --allow-busy. The Markdown is appended to
    $GITHUB_STEP_SUMMARY when it is set. JSON: a sweep's is {"has_regression", "points":
    [...]}, one object per point.

    With --history DIR instead of BASE NEW: DIR's subfolders are runs of one spec; for each
    gated metric, one value per run and the runs where its level shifted (E-Divisive means, a
    seeded permutation test), as a table, JSON (--format json) or an HTML page of the series
    (--html). Exit 1 when a metric's last shift is a regression past its gate (still there)."""
    check_file_option(junit_path, "--junit")
    check_file_option(html_path, "--html")
    if history_path is not None:
        if baseline is not None or new is not None:
            raise UserError("--history DIR takes no BASE or NEW; give either BASE NEW or --history")
        two_run_only = {
            "--allow-busy": allow_busy,
            "--force-devices": force_devices,
            "--allow-missing": allow_missing,
        }
        for option, is_given in two_run_only.items():
            if is_given:
                raise UserError(f"{option} is for BASE NEW, not --history; drop it")
        _history(history_path, gates_path, fmt, html_path, junit_path, force, seed)
        return
    if baseline is None or new is None:
        raise UserError("give BASE and NEW (two run folders), or --history DIR")
    from llmbench.compare.gates import load_gates
    from llmbench.compare.runs import pair_runs
    from llmbench.compare.verdict import compare as judge_gates

    pairs = pair_runs(baseline, new, force=force)
    gates = load_gates(gates_path) if gates_path is not None else _default_gates(pairs[0])
    points = [
        (
            pair.point,
            judge_gates(
                pair.baseline.samples,
                pair.new.samples,
                gates,
                allow_busy=allow_busy,
                force_devices=force_devices,
                allow_missing=allow_missing,
                seed=seed,
            ),
        )
        for pair in pairs
    ]
    uses_latency = any(gate.info.is_per_request for gate in gates)
    uses_repetitions = any(not gate.info.is_per_request for gate in gates)
    for pair in pairs:
        for line in _notes(pair, uses_latency, uses_repetitions):
            click.echo(f"note: {line}", err=True)
    for line in _capacity_notes(pairs):
        click.echo(f"note: {line}", err=True)
    emit_verdicts(points, pairs, fmt, junit_path, html_path)


def emit_verdicts(
    points: list[tuple[str | None, Comparison]],
    pairs: list[RunPair],
    fmt: str,
    junit_path: Path | None,
    html_path: Path | None,
) -> None:
    """The verdicts on stdout in `fmt`, the JUnit and HTML files, the Markdown on
    $GITHUB_STEP_SUMMARY, and the exit: 1 on a regression, 2 when a gate gave no verdict (each
    named on stderr), else 0. `pairs` (one per point) are what the HTML page draws."""
    from llmbench.compare import sweep_output
    from llmbench.compare.verdict import WHAT_TO_PASS

    click.echo(sweep_output.render(points, fmt), nl=False)
    if junit_path is not None:
        write_text(junit_path, sweep_output.render_junit(points), "--junit")
    if html_path is not None:
        from llmbench.reports.compare_page import render as render_page

        page = render_page(list(zip(pairs, (c for _, c in points), strict=True)))
        write_text(html_path, page.html, "--html")
    step_summary = os.environ.get(STEP_SUMMARY_ENV)
    if step_summary:
        write_text(
            Path(step_summary),
            sweep_output.render_markdown(points) + "\n",
            f"${STEP_SUMMARY_ENV}",
            append=True,
        )
    # The table explains each verdict under it; Markdown and JSON go to files and bots, so the
    # people reading the log get the verdicts that need a look on stderr.
    errors_follow = not sweep_output.has_regression(points)  # then the refused are errors below
    for point, comparison in points if fmt != "table" else ():
        where = f"{point}: " if point else ""
        shown = ("regression", "inconclusive")
        if not (errors_follow and comparison.is_unusable):
            shown += ("refused",)
        for result in comparison.results:
            if result.verdict in shown:
                click.echo(
                    f"{result.verdict}: {where}{result.gate.name}: {result.reason}", err=True
                )
    if sweep_output.has_regression(points):
        sys.exit(1)
    if sweep_output.is_unusable(points):  # no silent pass: a gate without a verdict is no pass
        for point, comparison in points:
            where = f"{point}: " if point else ""
            if not comparison.results:
                click.echo(f"error: {where}no gates to judge; give --gates", err=True)
            for result in comparison.without_verdict:
                hint = WHAT_TO_PASS[result.verdict]
                click.echo(
                    f"error: {where}{result.gate.name}: {result.verdict}: {result.reason}; {hint}",
                    err=True,
                )
        sys.exit(2)


def _history(
    folder: Path,
    gates_path: Path | None,
    fmt: str,
    html_path: Path | None,
    junit_path: Path | None,
    force: bool,
    seed: int,
) -> None:
    """`--history DIR`: change points per gated metric; exit 1 on a regression still there."""
    from llmbench.compare import history
    from llmbench.compare.gates import load_gates

    if fmt == "markdown" or junit_path is not None:
        given = "--junit" if junit_path is not None else "--format markdown"
        raise UserError(f"{given} is for BASE NEW; --history writes a table, json or --html")
    runs = history.load_history(folder, force=force)
    notes: list[str] = []
    if gates_path is not None:
        gates = load_gates(gates_path)
    else:
        gates, notes = history.history_gates(runs)
    for r in runs.runs:
        if r.run.result.provenance.machine_load.is_busy:
            notes.append(f"{r.name} ran on a busy machine: its numbers are pessimistic")
        if r.run.result.interrupted:
            notes.append(f"{r.name} was interrupted ({r.run.result.stop_reason})")
    for line in notes:
        click.echo(f"note: {line}", err=True)
    metrics = history.analyse(runs, gates, seed=seed)
    missing = [m.info.name for m in metrics if not m.values]
    if missing:
        raise UserError(
            f"no run in {folder} measured {', '.join(missing)}; leave it out of --gates"
        )
    click.echo(history.render(runs, metrics, fmt, seed=seed), nl=False)
    if html_path is not None:
        from llmbench.reports.history_page import render as render_page

        write_text(html_path, render_page(runs, metrics, seed=seed).html, "--html")
    failing = [m for m in metrics if m.is_failing]
    for m in failing if fmt != "table" else ():
        click.echo(f"regression: {history.failing_line(m)}", err=True)
    if failing:
        sys.exit(1)


def _default_gates(pair: RunPair) -> tuple[Gate, ...]:
    """The shipped gates for what BASE and NEW are (`runs.default_gates_of`), saying which
    latency gates it left out."""
    from llmbench.compare.runs import default_gates_of

    gates, left_out = default_gates_of([pair.baseline, pair.new])
    if left_out:
        click.echo(
            f"note: default latency gates left out ({', '.join(left_out)}): a side has no "
            "requests.jsonl",
            err=True,
        )
    return gates


def _capacity_notes(pairs: list[RunPair]) -> list[str]:
    """Two sweeps with SLOs: each side's highest load that met them, over the points compared
    (`capacity.capacity_line`); the gates judge each point, these lines the whole sweep."""
    from llmbench.harness import capacity

    if not pairs or pairs[0].point is None:
        return []
    lines = []
    for side, runs in (
        ("BASE", [pair.baseline.result for pair in pairs]),
        ("NEW", [pair.new.result for pair in pairs]),
    ):
        line = capacity.capacity_line(runs)
        if line is not None:
            lines.append(f"{side}: {line}")
    return lines


def _notes(pair: RunPair, uses_latency: bool, uses_repetitions: bool) -> list[str]:
    """What a reader of the verdicts must know about each side: busy, interrupted, no records,
    one repetition (no interval for rates and roofline fractions)."""
    where = f"{pair.point}: " if pair.point else ""
    lines = []
    for side, run in (("BASE", pair.baseline), ("NEW", pair.new)):
        load = run.result.provenance.machine_load
        if load.is_busy:
            lines.append(
                f"{where}{side} ran on a busy machine (other processes used "
                f"{load.other_processes_cores} of {load.cpu_count} cores): a regression there "
                "is called inconclusive unless --allow-busy"
            )
        if run.result.interrupted:
            lines.append(
                f"{where}{side} was interrupted ({run.result.stop_reason}): its numbers cover "
                "what ended"
            )
        if uses_repetitions and run.num_repetitions == 1:
            lines.append(
                f"{where}{side} has 1 repetition: its rates and roofline fractions have no "
                "interval, so their gates judge the change alone (`llmbench run --repeat 3`)"
            )
        if uses_latency and not run.has_records:
            lines.append(
                f"{where}{side} has no requests.jsonl beside {run.path}: its latency gates "
                "have no data"
            )
    return lines


def write_text(path: Path, text: str, option: str, append: bool = False) -> None:
    try:
        with path.open("a" if append else "w") as f:
            f.write(text)
    except OSError as e:
        raise UserError(f"{option} {path}: cannot write it ({e.strerror or e})") from None
