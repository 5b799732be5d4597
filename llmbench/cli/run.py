"""`llmbench run`, `report` and `export`: benchmark a workload; render or flatten a run folder."""

from __future__ import annotations

import difflib
import sys
from collections.abc import Callable
from pathlib import Path

import click

from llmbench.cli.options import gpu_hour_price_option
from llmbench.errors import BackendFailure, UserError


@click.command()
@click.argument("workload")
@click.option(
    "--set",
    "overrides",
    multiple=True,
    metavar="KEY.PATH=VALUE",
    help="override a spec field, e.g. --set load.concurrency=8 (repeatable)",
)
@click.option(
    "--vary",
    multiple=True,
    metavar="KEY.PATH=V1,V2,...",
    help="run the workload once per value, each a run folder under OUT/variants/<value>/, and "
    "compare them in OUT/report.html, e.g. --vary engine.quantize=none,int8,int4 (repeatable: "
    "one variant per combination; or list `variants:` in the spec)",
)
@click.option(
    "--out",
    type=click.Path(path_type=Path),
    default=None,
    help="run folder (default: <output_dir>/<name>-<time>); one that holds a run already is "
    "refused unless --force",
)
@click.option(
    "--force",
    is_flag=True,
    help="replace the run in --out: its files (results.json, the records, reports, sweep "
    "points, variants) are removed first; other files stay",
)
@click.option(
    "--repeat",
    type=int,
    default=None,
    metavar="N",
    help="measure the workload N times on the same engine (warm-up once) and report the spread "
    "between repetitions (the spec's `repeat`, default 1)",
)
@click.option(
    "--prices",
    default=None,
    metavar="SHEET",
    help="price the run's tokens with this price sheet (a YAML file, or a shipped example: "
    "claude-sonnet-4, gpt-4.1, deepseek-chat) into summary.cost (the spec's `prices`)",
)
@gpu_hour_price_option(
    "what the machine serving the run costs an hour (a GPU's rent, or this CPU's), in the price "
    "sheet's currency (USD without one): the run's tokens at its measured throughput as a price "
    "per million tokens, in summary.self_hosted (the spec's `gpu_hour_price`)"
)
@click.option(
    "--strict",
    is_flag=True,
    help="exit 1 when more measured requests failed than the spec's max_failed_fraction "
    "(default 0.05); without it such a run is flagged and exits 0",
)
@click.option(
    "--no-report",
    is_flag=True,
    help="write results.json and the records, not report.html, report.md and their figures "
    "(seconds a run; `ab`'s rounds skip them): `llmbench report OUT` renders them later",
)
@click.option(
    "--client-cpus",
    metavar="LIST",
    default=None,
    help="pin the client to these CPUs (as taskset -c takes them: 1, 2-3, 0,2-3); pin the "
    "server to others",
)
@click.option(
    "--shard",
    metavar="I/N",
    default=None,
    help="run only shard I of N of the schedule (openai backend; a host each), then join the "
    "shard folders with llmbench merge",
)
@click.option(
    "--start-at",
    type=float,
    default=None,
    metavar="UNIX_S",
    help="with --shard: start the schedule at this wall-clock time (seconds since the epoch), "
    "the same on every host",
)
def run(
    workload: str,
    overrides: tuple[str, ...],
    vary: tuple[str, ...],
    out: Path | None,
    force: bool,
    repeat: int | None,
    prices: str | None,
    gpu_hour_price: float | None,
    strict: bool,
    no_report: bool,
    client_cpus: str | None,
    shard: str | None,
    start_at: float | None,
) -> None:
    """Benchmark WORKLOAD (a YAML file, or a shipped name: chat, rag, agentic).

    Prints a summary and, as the last line of stdout, the run folder; a sweep (`load.sweep`)
    prints each point's summary on stderr, then a table of its points and, last, the sweep
    folder. `--set load.kind=...` (or `workload.kind`) switches the kind, dropping the keys of
    the old kind the new one lacks, with a note. SIGINT, SIGTERM and SIGHUP stop the run with
    what it measured saved (exit 130, 143, 129); an engine crash too (one line naming the
    error, exit 1). A run whose measured requests all failed exits 1 with the most common error
    in one line, its results and reports written (with --strict, also one that failed more
    than max_failed_fraction).

    With variants (`--vary`, or `variants:` in the spec) each configuration runs in turn into
    OUT/variants/<name>/, a whole run folder of its own, and OUT/report.html puts them side by
    side; a variant that fails is listed with its error, the others still run, and the run
    exits 1.

    A write that fails (a full disk) stops the run: one line naming the file and the space left
    there, what was kept, exit 1. An --out that holds a run already is refused (exit 2) unless
    --force replaces it."""
    from llmbench.harness import client_load, shards
    from llmbench.harness.failures import RunFailed
    from llmbench.harness.run import execute
    from llmbench.harness.run_signals import RunInterrupted
    from llmbench.harness.variants import load_variants

    if repeat is not None and repeat < 1:
        raise UserError(f"--repeat {repeat}: must be >= 1")
    sets = [*overrides, *([f"repeat={repeat}"] if repeat is not None else [])]
    sets += [f"prices={prices}"] if prices is not None else []
    sets += [f"gpu_hour_price={gpu_hour_price}"] if gpu_hour_price is not None else []
    spec, variants = load_variants(workload_path(workload), sets, vary)
    if variants and shard is not None:
        raise UserError("--shard: not with variants; shard a run of one configuration")
    own_shard = shards.from_options(shard, start_at, spec)
    if client_cpus is not None:
        client_load.pin(client_load.parse_cpu_list(client_cpus), client_cpus)
    reports = _reports(no_report)
    try:
        if variants:
            _run_variants(spec, variants, out, strict, force, no_report)
            return
        if own_shard is None:
            sweep_report = lambda root: _sweep_report(root, spec, reports)  # noqa: E731
        else:  # A shard holds part of a run: the reports are the merged folder's (`merge`).
            reports, sweep_report = _no_reports, click.echo
        execute(
            spec,
            out,
            reports,
            is_strict=strict,
            shard=own_shard,
            write_sweep_report=sweep_report,
            force=force,
        )
    except RunFailed as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(1)
    except RunInterrupted as e:
        if e.skipped is not None:  # a second signal: what it skipped, and how to get it back
            click.echo(e.skipped, err=True)
        click.echo(str(e), err=True)  # "interrupted by SIGTERM"
        sys.exit(e.exit_code)
    except BackendFailure as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(1)


def _no_reports(root: Path) -> list[Path]:
    """`--no-report` (and a shard, whose reports are the merged folder's): none written."""
    return []


def _reports(no_report: bool) -> Callable:
    """What draws a run folder's reports: `write_reports`, or nothing with `--no-report`."""
    from llmbench.reports.render import write_reports

    return _no_reports if no_report else write_reports


def _run_variants(
    spec, variants, out: Path | None, strict: bool, force: bool, no_report: bool
) -> None:
    """Run every variant, then print the comparison and, as the last line of stdout, the
    folder (also when a variant failed: `RunFailed` follows). The root folder is claimed as a
    plain run's is (refused when it holds a run, unless `force`). Each variant's reports
    and the page that sets them side by side are drawn unless `no_report`."""
    from llmbench.harness.run_folder import claim_folder, default_folder, removed_if_left_empty
    from llmbench.harness.run_variants import execute_variants
    from llmbench.reports import variant_tables
    from llmbench.reports.variants_page import write_variants_report

    def top_report(root: Path) -> None:
        if not no_report:
            write_variants_report(root)
        click.echo(f"\n{variant_tables.terminal_table(variant_tables.load(root)[1])}")
        click.echo(root)

    root = out or default_folder(spec.output_dir, spec.name)
    with removed_if_left_empty(root):
        claim_folder(root, force=force)
        execute_variants(spec, variants, root, _reports(no_report), top_report, is_strict=strict)


def _sweep_report(root: Path, spec, reports: Callable) -> None:
    """A sweep folder's reports (`reports`), then a table of its points (the numbers of
    report.md's, with the requests completed and failed), the highest load that met the SLOs,
    and, as the last line of stdout, the folder."""
    from llmbench.reports import rundata, tables
    from llmbench.reports.variant_tables import text_table

    reports(root)
    points = rundata.sweep_points(root)
    load = "concurrency" if spec.load.kind == "concurrency" else "rate/s"
    header = [load, "completed", "failed", *tables.sweep_header(points)[1:]]
    rows = [
        [row[0], str(run.summary["num_completed"]), str(run.summary["num_failed"]), *row[1:]]
        for run, row in zip(points, tables.sweep_rows(points), strict=True)
    ]
    click.echo("\n" + "\n".join(text_table(header, rows)))
    capacity = tables.sweep_capacity(points)
    if capacity:
        click.echo(capacity)
    click.echo(root)


@click.command()
@click.argument("run_dir", type=click.Path(path_type=Path))
def report(run_dir: Path) -> None:
    """Render report.html and report.md of RUN_DIR (a run, sweep or variants folder) from its
    files alone.

    Needs no torch: a report can be rebuilt on any machine that has the folder. A run that was
    killed before it wrote results.json gets it rebuilt from its record files first."""
    from llmbench.reports.render import write_reports

    _rebuild_missing_results(run_dir)
    for path in write_reports(run_dir):
        click.echo(path)


@click.command()
@click.argument("run_dir", type=click.Path(path_type=Path))
@click.option(
    "--format", "fmt", default="csv", show_default=True, type=click.Choice(["csv", "parquet"])
)
@click.option(
    "--out",
    type=click.Path(path_type=Path),
    default=None,
    help="folder for the tables (default: RUN_DIR/export)",
)
def export(run_dir: Path, fmt: str, out: Path | None) -> None:
    """Flatten RUN_DIR into requests, steps and summary tables (CSV or Parquet) via pandas; a
    sweep's or variants folder's runs share the tables, each row led by its `run`."""
    from llmbench.harness.run_folder import write_failed
    from llmbench.reports import rundata
    from llmbench.reports.export import export as export_run

    if out is not None and out.exists() and not out.is_dir():
        raise UserError(f"export --out {out}: is a file; give a folder for the tables")
    _rebuild_missing_results(run_dir)
    runs, folder = rundata.runs_in(run_dir), out or run_dir / "export"
    try:
        paths = export_run(runs, folder, fmt)
    except OSError as e:  # a full disk: one line naming the table
        raise write_failed(Path(e.filename) if e.filename else folder, e) from None
    for path in paths:
        click.echo(path)


def _rebuild_missing_results(folder: Path) -> None:
    """results.json of a killed run (and of each killed point of a sweep, each killed variant),
    rebuilt from its record files, with one line on stderr saying so."""
    from llmbench.harness.run_summary import can_rebuild, rebuild
    from llmbench.harness.sweep_folders import point_folders

    points = point_folders(folder)
    for run_folder in (folder, *points, *sorted(folder.glob("variants/*"))):
        if can_rebuild(run_folder):
            result = rebuild(run_folder)
            click.echo(
                f"{run_folder}: no results.json (the run was killed, or could not write it): "
                f"rebuilt it from requests.jsonl and steps.jsonl "
                f"({result.summary['num_completed']} requests completed)",
                err=True,
            )


def workload_path(workload: str) -> Path:
    """A YAML path, or the name of a shipped workload; a name that is neither is one line, with
    the closest shipped name when one is close (`chta`: did you mean chat?)."""
    path = Path(workload)
    if path.is_file():
        return path
    folder = Path(__file__).resolve().parents[1] / "workloads"
    shipped = sorted(p.stem for p in folder.glob("*.yaml"))
    if path.suffix == "" and workload in shipped:
        return folder / f"{workload}.yaml"
    names = ", ".join(shipped)
    close = difflib.get_close_matches(path.stem, shipped, n=1) if path.parent == Path() else []
    if close:
        raise UserError(
            f"workload '{workload}': no such file; did you mean {close[0]}? (give a YAML path "
            f"or one of {names})"
        )
    raise UserError(f"workload '{workload}': no such file; give a YAML path or one of {names}")
