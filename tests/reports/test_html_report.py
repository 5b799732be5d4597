"""report.html from the template: text escaped, notes instead of figures for a run that
measured nothing, PNGs written beside the page."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

from matplotlib.image import imread

from llmbench.harness import metrics
from llmbench.harness.records import RequestRecord
from llmbench.reports import html_report
from llmbench.reports.figure import PNG_DPI
from llmbench.reports.rundata import RunData

MS = 1_000_000


def _run(name: str, requests: list[RequestRecord], interrupted: bool = False) -> RunData:
    given = {
        "folder": Path("."),
        "results": {
            "name": name,
            "interrupted": interrupted,
            "summary": metrics.summarize(requests),
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
    assert "engine · m&lt;1&gt; · " in html  # the subtitle
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
