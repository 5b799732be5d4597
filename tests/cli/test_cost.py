"""A run priced with a shipped sheet (`--prices`): the bill in results.json, the summary line and
both reports; no sheet, no money."""

from __future__ import annotations

import json

import pytest

from llmbench.harness.cost import cost_summary, self_hosted_summary
from llmbench.harness.prices import load_prices
from llmbench.harness.record_log import read_requests
from tests.harness.test_run import TINY, llmbench

# 2 agent tasks of 3 requests (2 tool steps, then the answer), short replies, no tool wait.
AGENT = [*TINY, *("--set", "workload.sessions=2", "--set", "workload.tool_steps=2")]
AGENT += ["--set", "workload.output_tokens=8", "--set", "workload.final_output_tokens=8"]
AGENT += ["--set", "workload.tool_latency_s=0", "--set", "workload.tool_result_tokens=40"]


@pytest.fixture(scope="module")
def priced(tmp_path_factory):
    out = tmp_path_factory.mktemp("priced") / "run"
    result = llmbench(
        "run", *("agentic", *AGENT, "--prices", "claude-sonnet-4", "--gpu-hour-price", "2.5"),
        "--out", str(out),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return out, result


def test_the_bill_is_the_records_priced(priced):
    out, result = priced
    cost = json.loads((out / "results.json").read_text())["summary"]["cost"]
    records = read_requests(out)
    assert cost == pytest.approx(cost_summary(records, load_prices("claude-sonnet-4")))
    assert cost["num_billed"] == 6 and cost["total"] > 0
    assert cost["cache_hit_tokens"] > 0  # later turns reuse the engine's prefix cache
    assert 0 < cost["cache_discount"] < 1 and cost["is_example"] is True
    assert "cost (claude-sonnet-4 (example), USD list price (an example, not a quote)" in (
        result.stdout
    )
    for report in ("report.md", "report.html"):
        text = (out / report).read_text()
        assert "Cost" in text and "cache discount" in text


def test_the_machine_price_prices_the_measured_throughput(priced):
    out, result = priced
    results = json.loads((out / "results.json").read_text())
    summary, spec = results["summary"], results["spec"]
    hosted = summary["self_hosted"]
    assert spec["gpu_hour_price"] == 2.5
    assert hosted == pytest.approx(self_hosted_summary(2.5, "USD", summary))
    # By hand: 2.5 / 3600 per second over the tokens of a second, per million.
    rate = summary["output_tok_per_s"]
    assert hosted["per_million_output_tokens"] == pytest.approx(2.5 / 3600 / rate * 1e6)
    assert hosted["run_total"] == pytest.approx(2.5 * summary["duration_s"] / 3600)
    assert "self-hosted at 2.5 USD/hour: " in result.stdout
    assert "the price sheet: " in result.stdout
    for report in ("report.md", "report.html"):
        assert "self-hosted, per million tokens" in (out / report).read_text()


def test_no_sheet_no_money(tmp_path):
    out = tmp_path / "run"
    sets = ["--set", "workload.sessions=2", "--no-report"]
    result = llmbench("run", "rag", *TINY, *sets, "--out", str(out))
    assert result.returncode == 0, result.stderr
    summary = json.loads((out / "results.json").read_text())["summary"]
    assert "cost" not in summary and "self_hosted" not in summary
    assert "cost (" not in result.stdout


def test_an_unknown_sheet_is_one_line(tmp_path):
    result = llmbench("run", "rag", *TINY, "--prices", "no-such-sheet", "--out", str(tmp_path))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("error: --set prices=no-such-sheet: prices: 'no-such-sheet': no such")
