"""The verdict table as terminal text, Markdown, JUnit XML and JSON, from a hand-built result."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from dataclasses import replace

from llmbench.compare.gates import Gate
from llmbench.compare.output import (
    render_json,
    render_junit,
    render_markdown,
    render_table,
    to_dict,
)
from llmbench.compare.verdict import Comparison, GateResult, MetricDelta


def delta(metric, baseline, new, d, low, high, new_low=None, new_high=None):
    return MetricDelta(metric, baseline, new, d, low, high, new_low, new_high, 3, 3)


RESULTS = (
    GateResult(
        Gate("tpot_ms.p50", "max_increase", 0.05),
        delta("tpot_ms.p50", 20.0, 24.0, 0.2, 0.12, 0.28, 23.0, 25.0),
        "regression",
        "tpot_ms.p50 rose 20.0% (95% CI +12.0% to +28.0%), past the 5% allowed",
    ),
    GateResult(
        Gate("decode_mbu", "max_decrease", 0.1),
        delta("decode_mbu", 0.6, 0.58, -0.0333, -0.08, 0.01, 0.55, 0.61),
        "within noise",
        "decode_mbu changed -3.3% (95% CI -8.0% to +1.0%): not wholly past ±10%",
    ),
    GateResult(
        Gate("decode_mbu", "min", 0.5),
        delta("decode_mbu", 0.6, 0.58, -0.0333, -0.08, 0.01, 0.55, 0.61),
        "pass",
        "decode_mbu = 0.58 (95% CI 0.55 to 0.61): within the floor 0.5",
    ),
    GateResult(
        Gate("prefix_cache_hit_rate", "max_decrease", 0.1),
        delta("prefix_cache_hit_rate", 0.0, 0.5, None, None, None, 0.4, float("inf")),
        "no data",
        "prefix_cache_hit_rate is 0 in BASE: a relative change is undefined",
    ),
    GateResult(
        Gate("ttft_ms.p99", "max_increase", 0.1),
        delta("ttft_ms.p99", 100.0, 90.0, -0.1, -0.2, float("inf")),
        "refused",
        "ttft_ms.p99 is a raw time: not compared between devices (a | b vs c) unless forced",
    ),
)
COMPARISON = Comparison(
    results=RESULTS,
    baseline_device="cpu: epyc",
    new_device="cpu: xeon",
    is_baseline_busy=False,
    is_new_busy=True,
    confidence=0.95,
    num_resamples=1000,
    seed=0,
)


def test_terminal_table():
    text = render_table(COMPARISON)
    lines = text.splitlines()
    assert lines[0] == (
        "llmbench compare: REGRESSION (1 regression, 1 refused, 1 no data, 1 within noise, 1 pass)"
    )
    assert lines[1:3] == ["BASE: cpu: epyc", "NEW: cpu: xeon (machine busy)"]
    header, rule = lines[4], lines[5]
    assert header.split() == ["gate", "BASE", "NEW", "change", "95%", "CI", "verdict"]
    assert set(rule.replace(" ", "")) == {"-"}
    row = lines[6]
    assert row.startswith("tpot_ms.p50 max_increase 5%")
    assert "20 ms" in row and "24 ms" in row and "+20.0%" in row
    assert "+12.0% … +28.0%" in row and row.endswith("regression")
    assert "0.55 … 0.61" in lines[8] and lines[8].endswith("pass")  # min gate: NEW's interval
    assert "–" in lines[9]  # no delta without a baseline
    assert "-20.0% … +inf%" in lines[10]
    # the verdict column starts at the same place on every row
    starts = {
        line.index(v)
        for line, v in zip(
            lines[6:11], ("regression", "within noise", "pass", "no data", "refused"), strict=True
        )
    }
    assert len(starts) == 1
    # notes: every gate that is neither within noise nor a pass, with its reason
    assert lines[12:] == [
        "tpot_ms.p50 max_increase 5%: " + RESULTS[0].reason,
        "prefix_cache_hit_rate max_decrease 10%: " + RESULTS[3].reason,
        "ttft_ms.p99 max_increase 10%: " + RESULTS[4].reason,
    ]


def test_markdown_table():
    text = render_markdown(COMPARISON)
    lines = text.splitlines()
    assert lines[0].startswith("### llmbench compare: REGRESSION")
    assert "- NEW: cpu: xeon (machine busy)" in lines
    table = [line for line in lines if line.startswith("|")]
    assert len(table) == 2 + len(RESULTS)
    assert table[0] == "| gate | BASE | NEW | change | 95% CI | verdict |"
    assert table[1] == "|---|---|---|---|---|---|"
    assert table[2] == (
        "| `tpot_ms.p50 max_increase 5%` | 20 ms | 24 ms | +20.0% | +12.0% … +28.0% | "
        "**regression** |"
    )
    # a pipe inside a reason is escaped, so every row keeps its six cells
    assert "(a \\| b vs c)" in text
    for row in table:
        assert len(row.replace("\\|", "").split("|")) == 8


def test_junit_has_one_testcase_per_gate():
    root = ET.fromstring(render_junit(COMPARISON))
    suite = root.find("testsuite")
    cases = suite.findall("testcase")
    assert [c.get("name") for c in cases] == [r.gate.name for r in RESULTS]
    assert (
        suite.get("tests"),
        suite.get("failures"),
        suite.get("errors"),
        suite.get("skipped"),
    ) == ("5", "1", "2", "0")  # no data is an error: no silent pass
    failure = cases[0].find("failure")
    assert failure.get("type") == "regression" and failure.get("message") == RESULTS[0].reason
    assert cases[1].find("failure") is None and cases[1].find("skipped") is None
    assert cases[1].find("system-out").text.startswith("within noise: ")
    assert cases[3].find("error").get("type") == "no data"
    assert cases[4].find("error").get("type") == "refused"
    allowed = ET.fromstring(render_junit(replace(COMPARISON, allow_missing=True)))
    assert allowed.find("testsuite").get("errors") == "0"
    assert allowed.find("testsuite").get("skipped") == "2"
    properties = {p.get("name"): p.get("value") for p in suite.find("properties")}
    assert properties["new_busy"] == "true" and properties["baseline_device"] == "cpu: epyc"


def test_json_round_trip_without_infinities():
    data = json.loads(render_json(COMPARISON))
    assert data == to_dict(COMPARISON)
    assert data["has_regression"] is True
    assert data["new"] == {"device": "cpu: xeon", "is_busy": True}
    first = data["gates"][0]
    assert first["gate"] == "tpot_ms.p50 max_increase 5%"
    assert (first["threshold"], first["threshold_text"], first["unit"]) == (0.05, "5%", "ms")
    assert (first["delta"], first["delta_ci"], first["new_ci"]) == (0.2, [0.12, 0.28], [23.0, 25.0])
    assert first["metric_kind"] == "raw" and first["verdict"] == "regression"
    assert data["gates"][2]["threshold_text"] is None  # min gate: an absolute value
    assert data["gates"][3]["new_ci"] == [0.4, None]  # +inf is not JSON
    assert data["gates"][4]["delta_ci"] == [-0.2, None]


def test_no_gates_is_no_verdict_unless_missing_verdicts_are_allowed():
    empty = Comparison((), "cpu", "cpu", False, False, 0.95, 1000, 0)
    assert empty.is_unusable and not empty.has_regression
    assert render_table(empty).splitlines()[0] == "llmbench compare: NO VERDICT (no gates)"
    allowed = replace(empty, allow_missing=True)
    assert render_table(allowed).splitlines()[0] == "llmbench compare: no regression (no gates)"
    root = ET.fromstring(render_junit(empty))
    assert root.find("testsuite").get("tests") == "0"
    assert json.loads(render_json(empty))["gates"] == []


def test_a_single_repetition_shows_no_interval_rather_than_a_point():
    single = MetricDelta("decode_mbu", 0.6, 0.51, -0.15, None, None, None, None, 1, 1)
    result = GateResult(
        Gate("decode_mbu", "max_decrease", 0.1),
        single,
        "regression",
        "decode_mbu fell 15.0% (1 repetition: no interval), past the 10% allowed",
    )
    floor = GateResult(Gate("decode_mbu", "min", 0.5), single, "pass", "within the floor")
    comparison = Comparison((result, floor), "cpu", "cpu", False, False, 0.95, 1000, 0)
    rows = render_table(comparison).splitlines()[6:8]
    assert rows[0].endswith("-15.0%  1 repetition: no interval  regression")
    assert rows[1].endswith("1 repetition: no interval  pass")
    assert "| -15.0% | 1 repetition: no interval | **regression** |" in (
        render_markdown(comparison)
    )
    assert to_dict(comparison)["gates"][0]["delta_ci"] == [None, None]
