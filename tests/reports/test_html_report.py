"""report.html from the template: text escaped, notes instead of figures for a run that
measured nothing, PNGs written beside the page."""

from __future__ import annotations

import dataclasses
from dataclasses import fields
from pathlib import Path

from matplotlib.image import imread

from llmbench.harness import metrics
from llmbench.harness.records import RequestRecord, ServerTimings
from llmbench.reports import html_report
from llmbench.reports.figure import PNG_DPI
from llmbench.reports.rundata import RunData

MS = 1_000_000


def _run(
    name: str, requests: list[RequestRecord], interrupted: bool = False, warnings=()
) -> RunData:
    given = {
        "folder": Path("."),
        "results": {
            "name": name,
            "interrupted": interrupted,
            "summary": {**metrics.summarize(requests), "warnings": list(warnings)},
            "provenance": {"backend": "engine", "model": "m<1>", "device": {"name": "cpu"}},
            "spec": {"name": name},
            "roofline": None,
        },
        "requests": requests,
        "steps": [],
        "sessions": [],
        "telemetry": [],
    }
    return RunData(**{f.name: given.get(f.name) for f in fields(RunData)})


def test_a_run_that_measured_nothing_gets_notes_instead_of_figures(tmp_path):
    page = html_report.render(_run("empty", [], interrupted=True))
    assert page.plots == []
    assert "The run was interrupted: these are partial results." in page.html
    assert "No roofline: no timed steps" in page.html
    assert "No completed request produced tokens: no latency figures." in page.html
    assert "Nothing was measured over time" in page.html
    assert "<figure" not in page.html
    page.write(tmp_path / "report.html")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.html"]  # no empty figures/


def test_text_from_the_run_is_escaped():
    html = html_report.render(_run("<script>alert(1)</script>", [])).html
    assert "<script>" not in html
    assert "<title>llmbench: &lt;script&gt;alert(1)&lt;/script&gt;</title>" in html
    assert '<p class="sub">engine m&lt;1&gt; ' in html  # the subtitle
    assert "&#34;name&#34;: &#34;&lt;script&gt;" in html  # the spec, as JSON in <pre>


def test_page_writes_its_figures_as_pngs_beside_it(tmp_path):
    token_ms = [[10, 12, 15], [20, 21, 30]]
    requests = [
        RequestRecord(
            request_id=f"r{i}",
            session_id=f"s{i}",
            turn=0,
            scheduled_ns=0,
            sent_ns=0,
            end_ns=ts[-1] * MS,
            chunk_ns=[t * MS for t in ts],
            chunk_tokens=[1] * len(ts),
        )
        for i, ts in enumerate(token_ms)
    ]
    page = html_report.render(_run("two", requests))
    keys = [plot.key for plot in page.plots]
    assert keys == [
        "ttft-cdf",
        "tpot-cdf",
        "itl-histogram",
        "timeline-tokens",
        "timeline-sequences",
    ]
    assert [f'<figure id="{k}">' in page.html for k in keys] == [True] * len(keys)
    assert page.write(tmp_path / "report.html") == tmp_path / "report.html"
    for plot in page.plots:
        width_in, height_in = plot.figure.get_size_inches()
        image = imread(tmp_path / "figures" / f"{plot.key}.png")
        assert image.shape[:2] == (round(height_in * PNG_DPI), round(width_in * PNG_DPI))


def _timed(i: int, prompt_ms: float, per_token_ms: float) -> RequestRecord:
    """Sent at 0: first token at 10 + 5i ms, then 3 more 4 ms apart (TPOT 4 ms)."""
    first = 10 + 5 * i
    return RequestRecord(
        request_id=f"r{i}",
        session_id=f"s{i}",
        turn=0,
        scheduled_ns=0,
        sent_ns=0,
        end_ns=(first + 12) * MS,
        chunk_ns=[(first + 4 * k) * MS for k in range(4)],
        chunk_tokens=[1] * 4,
        server_timings=ServerTimings("llama.cpp", prompt_ms, decode_ms_per_token=per_token_ms),
    )


def test_server_timings_get_a_table_and_figures_beside_the_clients():
    page = html_report.render(_run("timed", [_timed(0, 8.0, 3.0), _timed(1, 12.0, 3.5)]))
    assert "<h2>Server vs client</h2>" in page.html
    # Request 0: TTFT 10 ms, server 8 ms: 2 ms; request 1: 15 − 12 = 3 ms; mean 2.5.
    assert "<td>overhead (ttft_overhead_ms)</td><td>2.5</td>" in page.html
    assert "<td>overhead (tpot_overhead_ms)</td><td>0.8</td>" in page.html  # 4 − 3, 4 − 3.5
    keys = [plot.key for plot in page.plots]
    assert "server-client-ttft" in keys and "server-client-tpot" in keys
    no_timings = dataclasses.replace(_timed(0, 8.0, 3.0), server_timings=None)
    untimed = html_report.render(_run("untimed", [no_timings]))
    assert "Server vs client" not in untimed.html


def test_a_run_whose_requests_all_failed_has_a_banner_first():
    failed = RequestRecord("r", "s", 0, 0, 0, 5 * MS, error="HTTP 400: (empty body)")
    line = "all 1 measured requests failed; most common error (1 of 1): HTTP 400: (empty body)"
    html = html_report.render(_run("failed", [failed], warnings=[line])).html
    banner = f'<div class="banner" role="alert"><strong>Failed requests:</strong> {line}</div>'
    assert banner in html
    assert html.index(banner) < html.index('<div class="cards">')
    assert html.count("HTTP 400: (empty body)") == 1  # the banner, not a warning line again


def test_a_speculating_run_gets_its_speculative_table():
    run = _run("spec", [])
    assert "Speculative decoding" not in html_report.render(run).html
    block = {
        "num_proposed_tokens": 40,
        "num_accepted_tokens": 10,
        "acceptance_rate": 0.25,
        "num_verifies": 10,
        "mean_accepted_per_verify": 1.0,
        "mean_tokens_per_verify": 2.0,
        "draft_s": 0.01,
        "verify_s": 0.2,
        "draft_fraction": 0.05,
        "draft_flops": 0.0,
        "draft_bytes": 0.0,
    }
    results = {**run.results, "summary": {**run.summary, "speculative": block}}
    html = html_report.render(dataclasses.replace(run, results=results)).html
    assert "<h2>Speculative decoding</h2>" in html
    assert "<tr><th>draft tokens accepted</th><td>10 of 40 (25.0%)</td></tr>" in html


def test_a_sweep_names_the_points_that_ran_on_a_busy_machine(tmp_path):
    """The sweep page says what each point's own report says of a busy machine: a point from
    before `summary.warnings` by its recorded load, a newer one by its warning line."""
    from llmbench.reports import markdown_report, rundata
    from tests.harness.synthetic_runs import write_run
    from tests.reports.variant_folders import BUSY_SENTENCE, mark_busy

    write_run(tmp_path / "point-1", 1, sweep_point=1.0, num_requests=4)
    write_run(tmp_path / "point-2", 2, sweep_point=2.0, num_requests=4, is_busy=True)
    mark_busy(write_run(tmp_path / "point-4", 3, sweep_point=4.0, num_requests=4))
    points = rundata.sweep_points(tmp_path)
    html = html_report.render_sweep("sweep", points).html
    old = (
        "The machine was busy: other processes used 1.0 cores during the run (of 2); the "
        "numbers are pessimistic."
    )
    boxes = [f'<p class="warn">point-2: {old}</p>', f'<p class="warn">point-4: {BUSY_SENTENCE}</p>']
    assert html.count('<p class="warn">') == 2 and all(box in html for box in boxes)
    assert html.index(boxes[1]) < html.index("<table>")
    for point, sentence in (("point-2", old), ("point-4", BUSY_SENTENCE)):
        own = html_report.render(rundata.load(tmp_path / point)).html
        assert f'<p class="warn">{sentence}</p>' in own
    markdown = markdown_report.render_sweep("sweep", points).splitlines()
    assert markdown[2:4] == [
        f"> **warning:** point-2: {old}",
        f"> **warning:** point-4: {BUSY_SENTENCE}",
    ]
    quiet = html_report.render_sweep("sweep", points[:1]).html
    assert '<p class="warn">' not in quiet
