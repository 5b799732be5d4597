"""`llmbench export`: the run folder as tables that agree with the run's own numbers."""

from __future__ import annotations

import dataclasses
import json

import pandas as pd
import pytest

from llmbench.harness import metrics
from llmbench.reports import rundata
from tests.harness.test_run import llmbench


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_export_flattens_requests_steps_and_summary(run_folder, tmp_path, fmt):
    out = tmp_path / "tables"
    result = llmbench("export", str(run_folder), "--format", fmt, "--out", str(out))
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [
        str(out / f"{n}.{fmt}") for n in ("requests", "steps", "summary")
    ]
    read = pd.read_csv if fmt == "csv" else pd.read_parquet
    requests, steps, summary = (read(out / f"{n}.{fmt}") for n in ("requests", "steps", "summary"))

    run = rundata.load(run_folder)
    assert len(requests) == len(run.requests)  # measured requests only
    by_id = {r.request_id: r for r in run.requests}
    for row in requests.itertuples():
        record = by_id[row.request_id]
        assert row.ttft_ms == pytest.approx(metrics.ttft_ms(record))
        assert row.num_output_tokens == record.num_output_tokens
    raw_steps = [json.loads(line) for line in (run_folder / "steps.jsonl").read_text().splitlines()]
    assert list(steps["flops"]) == pytest.approx([s["flops"] for s in raw_steps])
    assert list(steps["sum_context_len"]) == [sum(s["context_lens"]) for s in raw_steps]
    assert len(summary) == 1
    assert summary["ttft_ms.p50"][0] == pytest.approx(run.summary["ttft_ms"]["p50"])
    assert summary["decode_mbu"][0] == pytest.approx(run.summary["decode_mbu"])


def test_a_sweeps_points_share_each_table_led_by_their_folder(tmp_path):
    from tests.harness.synthetic_runs import write_run

    for seed, value in ((1, 4.0), (2, 1.0)):  # written out of sweep order
        write_run(tmp_path / f"point-{value:g}", seed, sweep_point=value, num_requests=6)
    out = tmp_path / "tables"
    result = llmbench("export", str(tmp_path), "--out", str(out))
    assert result.returncode == 0, result.stderr
    requests, summary = pd.read_csv(out / "requests.csv"), pd.read_csv(out / "summary.csv")
    assert list(summary["run"]) == ["point-1", "point-4"]  # sweep order
    assert list(summary["sweep_point"]) == [1.0, 4.0]
    for point in ("point-1", "point-4"):
        run = rundata.load(tmp_path / point)
        mine = requests[requests["run"] == point]
        assert sorted(mine["request_id"]) == sorted(r.request_id for r in run.requests)
        own = summary[summary["run"] == point]
        assert own["tpot_ms.p50"].item() == pytest.approx(run.summary["tpot_ms"]["p50"])
    steps = pd.read_csv(out / "steps.csv")
    assert steps.columns[0] == "run" and set(steps["run"]) == {"point-1", "point-4"}


def test_a_variants_folder_exports_every_variant_that_ran(tmp_path):
    from tests.reports.variant_folders import write_variants

    folder = write_variants(tmp_path / "vary")  # fast and slow ran; broken failed early
    result = llmbench("export", str(folder), "--format", "parquet")
    assert result.returncode == 0, result.stderr
    summary = pd.read_parquet(folder / "export" / "summary.parquet")
    assert list(summary["run"]) == ["variants/fast", "variants/slow"]
    assert "sweep_point" not in summary.columns
    slow = rundata.load(folder / "variants" / "slow")
    assert summary["tpot_ms.p50"][1] == pytest.approx(slow.summary["tpot_ms"]["p50"])


def test_export_into_a_file_is_one_line(run_folder):
    result = llmbench("export", str(run_folder), "--out", str(run_folder / "results.json"))
    assert result.returncode == 2
    assert result.stderr == (
        f"error: export --out {run_folder / 'results.json'}: is a file; give a folder for the "
        "tables\n"
    )


def test_export_of_a_missing_folder_is_one_line(tmp_path):
    result = llmbench("export", str(tmp_path / "nope"))
    assert result.returncode == 2
    assert result.stderr.startswith(f"error: {tmp_path / 'nope'}: no such folder")


def test_request_rows_carry_the_servers_timings_as_columns():
    from llmbench.reports.export import request_rows
    from tests.reports.test_html_report import _run, _timed

    row = request_rows(_run("t", [_timed(0, 8.0, 3.0)]))[0]
    bare = dataclasses.replace(_timed(0, 8.0, 3.0), server_timings=None)
    untimed = request_rows(_run("u", [bare]))[0]
    assert "server_timings" not in row
    assert (row["server_prompt_ms"], row["ttft_overhead_ms"]) == (8.0, 2.0)  # TTFT 10 ms
    assert (row["server_decode_ms_per_token"], row["tpot_overhead_ms"]) == (3.0, 1.0)  # TPOT 4
    assert untimed["server_prompt_ms"] is None and untimed["tpot_overhead_ms"] is None
