"""`llmbench merge`: the shard folders of one run joined into one run folder."""

from __future__ import annotations

from pathlib import Path

import click


@click.command()
@click.argument("shard_dirs", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--out", required=True, type=click.Path(path_type=Path), help="the merged run folder")
def merge(shard_dirs: tuple[Path, ...], out: Path) -> None:
    """Merge SHARD_DIRS, the folders of `llmbench run --shard i/N` for every i of one run (on
    one host or several), into the run folder OUT, as one process sending the whole schedule
    would have written it: one requests.jsonl, sessions.jsonl and steps.jsonl on one clock,
    results.json and the reports. Sweep folders are merged point by point."""
    from llmbench.harness.merge import merge as merge_shards
    from llmbench.harness.results import RESULTS_FILE
    from llmbench.harness.run_folder import prepare_folder, removed_if_left_empty
    from llmbench.harness.summary_lines import format_summary
    from llmbench.harness.sweep_folders import point_folders, point_load
    from llmbench.reports.render import write_reports

    with removed_if_left_empty(out):
        prepare_folder(out)
        loads = {p.name: point_load(p.name) for d in shard_dirs for p in point_folders(d)}
        if loads and not any((d / RESULTS_FILE).is_file() for d in shard_dirs):
            for name in sorted(loads, key=lambda name: loads[name]):
                result = merge_shards([d / name for d in shard_dirs], out / name)
                click.echo(format_summary(result), err=True)
        else:
            click.echo(format_summary(merge_shards(list(shard_dirs), out)))
        write_reports(out)
    click.echo(out)
