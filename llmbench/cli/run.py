"""`llmbench run`, `report` and `export`: benchmark a workload; render or flatten a run folder."""

from __future__ import annotations

from pathlib import Path

import click

from llmbench.errors import UserError


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
    "--out",
    type=click.Path(path_type=Path),
    default=None,
    help="run folder (default: <output_dir>/<name>-<time>)",
)
def run(workload: str, overrides: tuple[str, ...], out: Path | None) -> None:
    """Benchmark WORKLOAD (a YAML file, or a shipped name: chat, rag, agentic).

    Prints a summary and, as the last line of stdout, the run folder."""
    from llmbench.harness.run import execute
    from llmbench.harness.spec import load_spec
    from llmbench.reports.render import write_reports

    spec = load_spec(_workload_path(workload), list(overrides))
    execute(spec, out, write_reports)


@click.command()
@click.argument("run_dir", type=click.Path(path_type=Path))
def report(run_dir: Path) -> None:
    """Render report.html and report.md of RUN_DIR (a run or sweep folder) from its files alone.

    Needs no torch: a report can be rebuilt on any machine that has the folder."""
    from llmbench.reports.render import write_reports

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
    """Flatten RUN_DIR into requests, steps and summary tables (CSV or Parquet) via pandas."""
    from llmbench.reports import rundata
    from llmbench.reports.export import export as export_run

    for path in export_run(rundata.load(run_dir), out or run_dir / "export", fmt):
        click.echo(path)


def _workload_path(workload: str) -> Path:
    path = Path(workload)
    if path.is_file():
        return path
    shipped = Path(__file__).resolve().parents[1] / "workloads" / f"{workload}.yaml"
    if path.suffix == "" and shipped.is_file():
        return shipped
    raise UserError(
        f"workload '{workload}': no such file; give a YAML path or one of chat, rag, agentic"
    )
