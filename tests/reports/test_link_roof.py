"""The host-link roof: its bandwidth from a simulated link or the datasheet, and the steps that
fetched offloaded weights drawn at their FLOPs per link byte."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

import numpy as np

from llmbench.reports import link_roof, plots
from llmbench.reports.rundata import RunData

S = 1_000_000_000
ROOFS = {"label": "measured cpu", "read_bytes_per_s": 1e10, "flops_per_s": 1e11, "sources": {}}


def _run(steps, datasheet=None) -> RunData:
    roofline = {"is_estimated": False, "roofs": ROOFS, "datasheet_roofs": datasheet}
    given = {
        "folder": Path("."),
        "results": {"summary": {}, "provenance": {}, "roofline": roofline, "spec": {}},
        "requests": [],
        "steps": steps,
        "sessions": [],
        "telemetry": [],
    }
    return RunData(**{f.name: given.get(f.name) for f in fields(RunData)})


def _step(t_s, link_bytes=0, link_s=0.0):
    """A 10 ms decode step of 1e8 FLOPs and 1e8 memory bytes."""
    return {
        "t_start_ns": int(t_s * S),
        "t_end_ns": int((t_s + 0.01) * S),
        "phase": "decode",
        "num_seqs": 1,
        "flops": 1e8,
        "bytes": 1e8,
        "link_bytes": link_bytes,
        "link_s_simulated": link_s,
    }


def test_a_simulated_link_is_the_rate_the_simulation_charged():
    # 64 MB in 2 ms and 32 MB in 1 ms: 96 MB / 3 ms = 32 GB/s (PCIe 4.0 x16).
    steps = [_step(0.0, 64_000_000, 0.002), _step(1.0), _step(2.0, 32_000_000, 0.001)]
    roof = link_roof.link_roof(_run(steps))
    assert roof == link_roof.LinkRoof(32e9, "host link (simulated)", True)


def test_a_real_link_takes_the_datasheets_bandwidth():
    datasheet = {**ROOFS, "label": "datasheet H100-SXM"}
    roof = link_roof.link_roof(_run([_step(0.0, 1_000_000)], datasheet))
    assert roof == link_roof.LinkRoof(64e9, "host link (datasheet H100-SXM)", False)
    assert link_roof.link_roof(_run([_step(0.0, 1_000_000)])) is None  # no datasheet: unknown
    assert link_roof.link_roof(_run([_step(0.0)])) is None  # nothing crossed a link


def test_the_roofline_draws_the_link_roof_and_the_steps_at_flop_per_link_byte():
    steps = [_step(0.0, 50_000_000, 0.002), _step(1.0)]
    plot = plots.roofline(_run(steps))
    ax = plot.figure.axes[0]
    labels = [line.get_label() for line in ax.lines]
    assert "host link (simulated): 25GB/s, 100GFLOP/s" in labels
    (hollow,) = [c for c in ax.collections if c.get_label().startswith("steps at FLOP per link")]
    # 1e8 FLOPs over 5e7 link bytes = 2 FLOP per link byte, at 1e8 FLOPs / 10 ms = 10 GFLOP/s.
    assert np.allclose(hollow.get_offsets(), [[2.0, 1e10]])
    assert hollow.get_urls() == ["decode step 0: 50MB over the link, 2 FLOP per link byte"]
    assert "host link (simulated) (25GB/s, dash-dot)" in plot.caption
    dense = plots.roofline(_run([_step(0.0)])).figure.axes[0]
    assert not any("host link" in line.get_label() for line in dense.lines)
