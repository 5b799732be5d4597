"""Formatted cells shared by report.html and report.md: numbers with SI prefixes, roofs."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

import pytest

from llmbench.reports import tables
from llmbench.reports.rundata import RunData


@pytest.mark.parametrize(
    "value, unit, text",
    [
        (1234, "", "1.23k"),
        (2.5e12, "FLOP/s", "2.5TFLOP/s"),
        (18.2e9, "B/s", "18.2GB/s"),
        (0.5, "", "0.5"),
        (0, "", "0"),
        (999, "", "999"),
        (2.5e-5, "s", "2.50e-05s"),
    ],
)
def test_si_prefixes(value, unit, text):
    assert tables.si(value, unit) == text


def _run(roofline: dict) -> RunData:
    given = {"folder": Path("."), "results": {"roofline": roofline}}
    return RunData(**{f.name: given.get(f.name) for f in fields(RunData)})


def test_roofs_name_each_roof_and_a_matmul_rate_not_measured():
    roofline = {
        "dtype": "bfloat16",
        "roofs": {"label": "measured X", "read_bytes_per_s": 19e9, "flops_per_s": None},
        "datasheet_roofs": {
            "label": "datasheet Y",
            "read_bytes_per_s": 3.35e12,
            "flops_per_s": 989e12,
        },
    }
    assert tables.roofs(_run(roofline)) == [
        ("measured X", "19GB/s read, (not measured) bfloat16 matmul"),
        ("datasheet Y", "3.35TB/s read, 989TFLOP/s bfloat16 matmul"),
    ]


def _summary_run(summary: dict) -> RunData:
    given = {"folder": Path("."), "results": {"summary": summary}}
    return RunData(**{f.name: given.get(f.name) for f in fields(RunData)})


def test_repetition_rows_one_per_repetition_then_mean_and_cv():
    def alone(k: int, tpot: float, mbu: float | None, is_partial: bool = False) -> dict:
        return {
            "repetition": k,
            "is_partial": is_partial,
            "num_completed": 10 + k,
            "output_tok_per_s": 30.0 + k,
            "ttft_ms": {"p50": 700.0},
            "tpot_ms": {"p50": tpot, "p99": 2 * tpot},
            "decode_mbu": mbu,
            "prefill_mfu": 0.2,
            "prefix_cache_hit_rate": 0.875,
        }

    repetitions = [alone(1, 60.0, 0.15), alone(2, 66.0, 0.16), alone(3, 70.0, None, True)]
    spread = {
        "output_tok_per_s": {"mean": 31.5, "stdev": 0.7071, "cv": 0.02245},
        "tpot_ms.p50": {"mean": 63.0, "stdev": 4.2426, "cv": 0.06734},
        "decode_mbu": {"mean": 0.155, "stdev": 0.00707, "cv": 0.04562},
    }
    rows = tables.repetition_rows(_summary_run({"repetitions": repetitions, "spread": spread}))
    assert len(tables.REPETITION_HEADER) == len(rows[0]) == 9
    assert rows == [
        ["1", "11", "31.0", "700.0", "60.0", "120.0", "0.15", "0.20", "0.88"],
        ["2", "12", "32.0", "700.0", "66.0", "132.0", "0.16", "0.20", "0.88"],
        ["3 (partial)", "13", "33.0", "700.0", "70.0", "140.0", "-", "0.20", "0.88"],
        ["mean", "", "31.5", "-", "63.0", "-", "0.15", "-", "-"],  # what the spread has
        ["cv", "", "2.2%", "-", "6.7%", "-", "4.6%", "-", "-"],
    ]
    # One repetition: nothing to show (the rest of the report is the run).
    assert tables.repetition_rows(_summary_run({"repetitions": repetitions[:1]})) == []
    assert tables.repetition_rows(_summary_run({})) == []
