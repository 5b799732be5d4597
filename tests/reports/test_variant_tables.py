"""The variants' side-by-side rows: from the variants' results files, ratios against the first,
quality and speculative blocks where measured, and the variants that did not end whole."""

from __future__ import annotations

import json

import pytest

from llmbench.reports import variant_tables
from llmbench.reports.variant_tables import times
from tests.reports.variant_folders import write_variants


@pytest.fixture(scope="module")
def variants(tmp_path_factory):
    folder = write_variants(tmp_path_factory.mktemp("variants"))
    index, runs = variant_tables.load(folder)
    summaries = {
        name: json.loads((folder / "variants" / name / "results.json").read_text())["summary"]
        for name in ("fast", "slow")
    }
    return index, runs, summaries


def test_load_keeps_the_index_order_and_runs_only_where_results_are(variants):
    index, runs, _ = variants
    assert index.name == "synthetic"
    assert [(v.name, v.run is not None) for v in runs] == [
        ("fast", True),
        ("slow", True),
        ("broken", False),
    ]
    assert [v.name for v in variant_tables.measured(runs)] == ["fast", "slow"]


def test_times_is_value_over_reference():
    assert times(3.0, 2.0) == "1.50x"
    assert times(22.89, 44.39) == "0.52x"
    assert times(None, 2.0) == times(1.0, None) == times(1.0, 0.0) == "-"


def test_speed_rows_read_the_summaries(variants):
    _, runs, summaries = variants
    # The synthetic runs have no SLOs: no goodput column.
    assert variant_tables.speed_header(runs) == (
        "variant",
        "output tok/s",
        "req/s",
        "TTFT p50 (ms)",
        "TTFT p90 (ms)",
        "TPOT p50 (ms)",
        "TPOT p90 (ms)",
        "ITL p50 (ms)",
        "ITL p90 (ms)",
        "decode MBU",
    )
    fast, slow = variant_tables.speed_rows(runs)
    s = summaries["slow"]
    assert slow == [
        "slow",
        f"{s['output_tok_per_s']:,.1f}",
        f"{s['request_per_s']:,.2f}",
        f"{s['ttft_ms']['p50']:,.1f}",
        f"{s['ttft_ms']['p90']:,.1f}",
        f"{s['tpot_ms']['p50']:,.1f}",
        f"{s['tpot_ms']['p90']:,.1f}",
        f"{s['itl_ms']['p50']:,.1f}",
        f"{s['itl_ms']['p90']:,.1f}",
        f"{s['decode_mbu']:.2f}",
    ]
    assert fast[0] == "fast"


def test_ratios_are_against_the_first_measured_variant(variants):
    _, runs, summaries = variants
    fast, slow = variant_tables.ratio_rows(runs)
    assert fast == ["fast"] + ["1.00x"] * 9
    f, s = summaries["fast"], summaries["slow"]
    assert slow[1] == f"{s['output_tok_per_s'] / f['output_tok_per_s']:.2f}x"
    assert slow[5] == f"{s['tpot_ms']['p50'] / f['tpot_ms']['p50']:.2f}x"
    # The slow run's latencies are twice the fast one's by construction: about 2x, not 1x.
    assert 1.5 < float(slow[5].removesuffix("x")) < 2.5
    assert variant_tables.ratio_rows(runs[:1]) == []


def test_config_quality_and_speculative_rows(variants):
    _, runs, _ = variants
    assert variant_tables.config_rows(runs)[1] == [
        "slow",
        "engine.quantize=int4",
        "float32",
        "4.000",
        "-",
        "-",
        "-",
    ]
    # Only the variant that measured quality / speculated has a row.
    assert variant_tables.quality_rows(runs) == [
        ["slow", "int4:32 / k=int8,v=int4", "12.500", "12.000", "0.0123", "0.875", "-"]
    ]
    assert variant_tables.speculative_rows(runs) == [
        ["slow", "none, k=4", "300 / 400", "75.0%", "3.00", "4.00", "0.25", "1.50", "12.5%"]
    ]


def test_status_rows_and_terminal_table(variants):
    _, runs, _ = variants
    assert variant_tables.status_rows(runs) == [
        ["broken", "failed", "model=nope", "nope: no such model"]
    ]
    lines = variant_tables.terminal_table(runs).splitlines()
    assert lines[0].split() == [
        "variant",
        "output",
        "tok/s",
        "TTFT",
        "p50",
        "TPOT",
        "p50",
        "decode",
        "MBU",
        "weight",
        "B/param",
        "perplexity",
        "acceptance",
    ]
    assert lines[2].split()[0] == "slow" and lines[2].split()[-2:] == ["12.500", "75.0%"]
    assert lines[3] == "broken   failed: nope: no such model"


def test_common_line_names_what_every_variant_shares(variants):
    _, runs, _ = variants
    assert variant_tables.common_line(runs) == (
        "chat workload, 8 sessions, load concurrency 4; engine synthetic:tiny float32 on "
        "Test CPU · git 0123abc"
    )
    assert variant_tables.common_line(runs[2:]) == ""  # nothing measured
