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
