"""The top report of a variants folder: every variant's row linking to its own report, the
failed one with its error, the same in report.md; `write_reports` re-renders them all; the page
opens in headless Chromium without an error or an outside request."""

from __future__ import annotations

import dataclasses

from llmbench.harness.results import read_results, write_results
from llmbench.reports import html_report, render, rundata, variants_page
from tests.reports.browser import open_in_chromium
from tests.reports.variant_folders import BUSY_SENTENCE, mark_busy, write_variants


def test_page_and_markdown_put_the_variants_side_by_side(tmp_path):
    page, markdown = variants_page.render(write_variants(tmp_path))
    html = page.html
    assert "<title>llmbench variants: synthetic</title>" in html
    assert '<td><a href="variants/fast/report.html">fast</a></td>' in html
    assert '<td><a href="variants/slow/report.html">slow</a></td>' in html
    assert "<h2>Against fast</h2>" in html
    assert "<h2>Quality</h2>" in html and "<h2>Speculative decoding</h2>" in html
    assert "3 variants: 1 failed; the others are compared below." in html
    assert "<td>broken</td><td>failed</td><td>model=nope</td><td>nope: no such model</td>" in html
    assert [p.key for p in page.plots] == [
        "variants-speed",
        "variants-ttft-cdf",
        "variants-tpot-cdf",
        "variants-speed-quality",
    ]
    lines = markdown.splitlines()
    assert lines[0] == "# llmbench variants: synthetic"
    assert "| broken | failed | model=nope | nope: no such model |" in lines
    assert [line for line in lines if line.startswith("## ")] == [
        "## Speed",
        "## Against fast",
        "## Configuration and memory",
        "## Quality",
        "## Speculative decoding",
        "## Prefix cache, routing and cost",
    ]
    # Engine runs, not routed nor priced: the hit rate and TTFT columns only.
    assert "| variant | prefix-cache hit rate | TTFT p50 (ms) | TTFT p99 (ms) |" in lines


def test_routed_and_priced_variants_add_their_columns(tmp_path):
    folder = write_variants(tmp_path)
    slow = folder / "variants" / "slow"
    result = read_results(slow)
    endpoints = [{"endpoint": i, "requests": n} for i, n in enumerate((6, 2))]
    cost = {"per_session": 0.0125, "currency": "USD", "cache_discount": 0.4}
    hosted = {"per_million_output_tokens": 0.75, "currency": "USD"}
    summary = {
        **result.summary,
        "endpoints": endpoints,
        "endpoint_imbalance": 1.5,
        "cost": cost,
        "self_hosted": hosted,
    }
    write_results(slow, dataclasses.replace(result, summary=summary))
    _, markdown = variants_page.render(folder)
    lines = markdown.splitlines()
    header = next(line for line in lines if line.startswith("| variant | prefix-cache hit rate"))
    assert header.endswith(
        "| requests per endpoint | imbalance | cost per session | cache discount "
        "| self-hosted per Mtok out |"
    )
    table = lines[lines.index("## Prefix cache, routing and cost") :]
    slow_row = next(line for line in table if line.startswith("| slow |"))
    assert slow_row.endswith("| 6 / 2 | 1.50 | 0.0125 USD | 40.0% | 0.7500 USD |")
    fast_row = next(line for line in table if line.startswith("| fast |"))
    assert fast_row.endswith("| - | - | - | - | - |")  # neither routed nor priced


def test_write_reports_renders_the_top_page_and_each_variants_own(tmp_path):
    folder = write_variants(tmp_path)
    html_path, md_path = render.write_reports(folder)
    assert (html_path, md_path) == (folder / "report.html", folder / "report.md")
    assert (folder / "figures" / "variants-speed.png").is_file()
    for name in ("fast", "slow"):
        assert (folder / "variants" / name / "report.html").is_file()
    assert list((folder / "variants" / "broken").iterdir()) == []  # nothing to render there
    report = open_in_chromium(html_path, "figure svg", tmp_path / "shot.png")
    assert report.console_errors == [] and report.requests == []
    assert len(report.element_sizes) == 4 and all(w > 0 for _, w, _ in report.element_sizes)


def test_a_variant_on_a_busy_machine_is_named_as_its_own_report_names_it(tmp_path):
    folder = write_variants(tmp_path)
    mark_busy(folder / "variants" / "slow")
    page, markdown = variants_page.render(folder)
    box = f'<p class="warn">slow: {BUSY_SENTENCE}</p>'
    assert page.html.count('<p class="warn">') == 1 and box in page.html
    assert page.html.index(box) < page.html.index("<h2>Speed</h2>")
    assert f"> **warning:** slow: {BUSY_SENTENCE}" in markdown.splitlines()
    own = html_report.render(rundata.load(folder / "variants" / "slow")).html
    assert f'<p class="warn">{BUSY_SENTENCE}</p>' in own  # the same words as the run's report
    quiet, _ = variants_page.render(write_variants(tmp_path / "quiet"))
    assert '<p class="warn">' not in quiet.html
