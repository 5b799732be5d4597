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
