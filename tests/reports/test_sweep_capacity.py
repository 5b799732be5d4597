"""A sweep with SLOs answers "how much load meets them": goodput columns beside each point, and
the highest load at which 90% of the requests met every SLO (`tables.sweep_capacity`)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from llmbench.harness.results import read_results, write_results
from llmbench.reports import markdown_report, rundata, tables
from tests.harness.synthetic_runs import write_run
from tests.harness.test_run import llmbench

SLO = {"ttft_ms": 200.0, "tpot_ms": 50.0}


def write_sweep(folder: Path, met: dict[int, float], slo: dict | None = SLO) -> list:
    """A concurrency sweep whose point c had met[c] of its requests meet every SLO (good
    req/s: 2·c·met, a number to find again)."""
    for seed, (concurrency, fraction) in enumerate(met.items()):
        point = write_run(folder / f"point-{concurrency}", seed, sweep_point=float(concurrency))
        result = read_results(point)
        spec = {**result.spec, "slo": slo or {}, "load": {"kind": "concurrency", "sweep": []}}
        summary = {
            **result.summary,
            "goodput_fraction": fraction,
            "goodput_request_per_s": 2 * concurrency * fraction,
        }
        write_results(point, dataclasses.replace(result, spec=spec, summary=summary))
    return rundata.sweep_points(folder)


def test_the_highest_load_that_met_the_slos_for_90_percent_of_its_requests(tmp_path):
    points = write_sweep(tmp_path, {1: 1.0, 2: 0.95, 4: 0.85, 8: 0.40})
    assert tables.sweep_capacity(points) == (
        "highest load that met the SLOs (ttft_ms ≤ 200, tpot_ms ≤ 50) for 90% of its "
        "requests: concurrency 2, 3.80 good req/s (95.0% met)"
    )
    assert tables.sweep_header(points)[-2:] == ("goodput req/s", "SLOs met")
    assert [row[-2:] for row in tables.sweep_rows(points)] == [
        ["2.00", "100.0%"],
        ["3.80", "95.0%"],
        ["6.80", "85.0%"],
        ["6.40", "40.0%"],
    ]
    markdown = markdown_report.render_sweep("s", points).splitlines()
    assert markdown[2] == tables.sweep_capacity(points)
    assert markdown[4].endswith("| goodput req/s | SLOs met |")


def test_a_sweep_whose_top_point_passes_says_the_edge_lies_past_it(tmp_path):
    points = write_sweep(tmp_path, {1: 0.80, 2: 0.92})  # a noisy low point does not matter
    assert tables.sweep_capacity(points).endswith(
        "concurrency 2, 3.68 good req/s (92.0% met); the highest tried: the edge lies past it"
    )


def test_a_sweep_where_no_point_passes_names_the_closest(tmp_path):
    points = write_sweep(tmp_path, {1: 0.89, 4: 0.5})
    assert tables.sweep_capacity(points) == (
        "no point met the SLOs (ttft_ms ≤ 200, tpot_ms ≤ 50) for 90% of its requests; the "
        "closest: concurrency 1 (89.0%)"
    )


def test_a_sweep_without_slos_has_no_goodput_columns(tmp_path):
    points = write_sweep(tmp_path, {1: 1.0, 2: 1.0}, slo=None)
    assert tables.sweep_capacity(points) is None
    assert tables.sweep_header(points) == tables.SWEEP_HEADER
    assert all(len(row) == len(tables.SWEEP_HEADER) for row in tables.sweep_rows(points))


def test_the_sweeps_report_pages_carry_the_line(tmp_path):
    points = write_sweep(tmp_path, {1: 1.0, 2: 0.5})
    result = llmbench("report", str(tmp_path))
    assert result.returncode == 0, result.stderr
    line = tables.sweep_capacity(points)
    assert line.startswith("highest load that met the SLOs") and "concurrency 1," in line
    assert f"<p>{line}</p>" in (tmp_path / "report.html").read_text()
    assert line in (tmp_path / "report.md").read_text().splitlines()
