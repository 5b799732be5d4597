"""Plot data computed by hand from a small made-up run."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmbench.reports import plots
from llmbench.reports.rundata import RunData

S = 1_000_000_000  # ns


def _run(steps: list[dict], roofs: dict | None) -> RunData:
    return RunData(
        folder=Path("."),
        results={"summary": {}, "provenance": {}, "roofline": {"roofs": roofs}},
        requests=[],
        steps=steps,
        sessions=[],
        telemetry=[],
    )


def _step(start_s: float, end_s: float, phase: str, flops: float, num_bytes: float) -> dict:
    return {
        "t_start_ns": int(start_s * S),
        "t_end_ns": int(end_s * S),
        "phase": phase,
        "flops": flops,
        "bytes": num_bytes,
    }


def test_utilisation_per_time_bucket():
    roofs = {"read_bytes_per_s": 1000.0, "flops_per_s": 500.0}
    steps = [
        # Bucket 0 (steps ending before 2 s): 400 B of decode over the steps' own 1.5 s.
        _step(0.0, 1.0, "decode", 10, 100),
        _step(1.0, 1.5, "decode", 10, 300),
        # Bucket 1: a decode second with no bytes; 250 prompt-step FLOPs over 1 s.
        _step(1.5, 2.5, "decode", 0, 0),
        _step(2.5, 3.0, "prefill", 100, 50),
        _step(3.0, 3.5, "mixed", 150, 50),
    ]
    run = _run(steps, roofs)
    util = plots._utilization(run, t0=0, width_s=2.0, num=3)
    assert util["decode MBU"] == [pytest.approx(400 / 1.5 / 1000), 0.0, None]
    assert util["prefill and mixed MFU"] == [None, pytest.approx(250 / 1.0 / 500), None]
    assert plots._utilization(_run(steps, None), 0, 2.0, 3) is None  # no roofs, no panel


def test_roofline_draws_measured_and_datasheet_roofs_and_a_point_per_step():
    import xml.etree.ElementTree as ET

    run = _run(
        [
            {**_step(0.0, 0.001, "decode", 2e9, 1e9), "num_seqs": 1},
            {**_step(0.0, 0.010, "prefill", 5e11, 1e9), "num_seqs": 1},
        ],
        {"label": "measured X", "read_bytes_per_s": 2e12, "flops_per_s": 5e14},
    )
    run.results["roofline"]["datasheet_roofs"] = {
        "label": "datasheet H100-SXM",
        "read_bytes_per_s": 3.35e12,
        "flops_per_s": 989e12,
    }
    figure = plots.roofline(run)
    plot = ET.fromstring(figure.svg).find("svg")
    lines = plot.findall("polyline")
    # measured roof, its ridge marker, then the datasheet roof dashed (no ridge marker)
    assert [line.get("stroke-dasharray") for line in lines] == [None, "2 3", "6 4"]
    assert len(plot.findall("g/circle")) == 2
    legend = [t.text for t in ET.fromstring(figure.svg).iter("text")]
    assert "measured X: 2TB/s, 500TFLOP/s" in legend
    assert "datasheet H100-SXM: 3.35TB/s, 989TFLOP/s" in legend
    assert "decode steps (1)" in legend and "prefill steps (1)" in legend
