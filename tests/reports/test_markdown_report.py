"""report.md: the failure banner first, the server-vs-client table when the server timed itself."""

from __future__ import annotations

from llmbench.harness.records import RequestRecord
from llmbench.reports import markdown_report
from tests.reports.test_html_report import MS, _run, _timed


def test_the_banner_comes_before_the_tables_and_the_warning_is_not_repeated():
    failed = RequestRecord("r", "s", 0, 0, 0, 5 * MS, error="HTTP 400: (empty body)")
    line = "all 1 measured requests failed; most common error (1 of 1): HTTP 400: (empty body)"
    md = markdown_report.render(_run("failed", [failed], warnings=[line]))
    assert f"> **FAILED REQUESTS:** {line}" in md
    assert md.index("FAILED REQUESTS") < md.index("| requests |")
    assert md.count("HTTP 400") == 1


def test_server_vs_client_table():
    md = markdown_report.render(_run("timed", [_timed(0, 8.0, 3.0), _timed(1, 12.0, 3.5)]))
    assert "## Server vs client" in md
    # TTFT overhead per request: 10 − 8 = 2 and 15 − 12 = 3 ms; mean and p50 2.5, p95 2.95.
    assert "| overhead (ttft_overhead_ms) | 2.5 | 2.5 | 2.9 | 3.0 | 3.0 | 2 |" in md
    assert "## Server vs client" not in markdown_report.render(_run("none", []))
