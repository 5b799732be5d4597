"""The page of `compare --history --html`: self-contained, a figure per gated metric with every
run's value on hover, the change point drawn where the shift began in the regression's colour,
the table of shifts; opened in headless Chromium with networking off."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest

from llmbench.compare.gates import parse_gates
from llmbench.compare.history import analyse, load_history
from llmbench.reports import history_page
from llmbench.reports.figure import GREEN, RED
from tests.harness.synthetic_runs import write_run
from tests.reports.browser import open_in_chromium

GATES = parse_gates(
    "tpot_ms.p50: {max_increase: 10%}\noutput_tok_per_s: {max_decrease: 50%}\n", "g"
)


@pytest.fixture(scope="module")
def page(tmp_path_factory) -> str:
    """10 runs, run-06 on 1.3× slower: tpot fails its 10%, tok/s shifts within its 50%."""
    root = tmp_path_factory.mktemp("history-page")
    for i in range(10):
        write_run(root / "runs" / f"run-{i:02d}", seed=100 + i, slowdown=1.3 if i >= 6 else 1.0)
    history = load_history(root / "runs")
    return history_page.render(history, analyse(history, GATES), seed=0).html


def _svg(html: str, key: str) -> ET.Element:
    start = html.index(f'<figure id="{key}">') + len(f'<figure id="{key}">')
    return ET.fromstring(html[start : html.index("<figcaption>", start)])


def _tips(svg: ET.Element) -> list[str]:
    return [g[0].text for g in svg.iter("g") if g.get("class") == "tip"]


def test_a_figure_per_metric_with_every_run_on_hover(page):
    for key in ("history-tpot_ms_p50", "history-output_tok_per_s"):
        tips = _tips(_svg(page, key))
        assert [t.split(":")[0] for t in tips] == [f"run-{i:02d}" for i in range(10)]
    assert all(t.endswith(" ms") for t in _tips(_svg(page, "history-tpot_ms_p50")))


def test_the_change_point_is_marked_in_the_regressions_colour(page):
    svg = ET.tostring(_svg(page, "history-tpot_ms_p50"), encoding="unicode")
    assert f"stroke: {RED.lower()}" in svg.lower() or f'stroke="{RED.lower()}"' in svg.lower()
    assert GREEN.lower() not in svg.lower()
    assert "run-06: " in svg and ": regression" in svg  # the legend names it


def test_the_table_and_title_say_what_is_still_there(page):
    assert "REGRESSION (tpot_ms.p50)" in page
    assert "A regression still there: tpot_ms.p50 shifted" in page
    assert "REGRESSION, still there" in page and "regression within its gate" in page
    assert "<script" not in page and "http://" not in page and "https://" not in page


def test_the_page_opens_offline_in_chromium(page, tmp_path):
    path = tmp_path / "history.html"
    path.write_text(page)
    opened = open_in_chromium(path, "figure > svg", tmp_path / "history.png")
    assert opened.console_errors == [] and opened.requests == []
    assert len(opened.element_sizes) == 2
    assert all(width > 300 and height > 150 for _, width, height in opened.element_sizes)
