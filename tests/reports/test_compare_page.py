"""The HTML diff of two runs: self-contained, both runs' roofline points drawn in their colours
with their numbers on hover, both CDFs, the verdict table; opened in headless Chromium."""

from __future__ import annotations

import dataclasses
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from llmbench.compare.gates import default_gates, parse_gates
from llmbench.compare.runs import pair_runs
from llmbench.compare.verdict import compare
from llmbench.harness.results import read_results, write_results
from llmbench.reports import compare_page
from llmbench.reports.figure import BLUE, ORANGE, RED
from tests.harness.synthetic_runs import write_run, write_sweep
from tests.reports.browser import open_in_chromium
from tests.reports.test_report import Tags

GATES = parse_gates("tpot_ms.p50: {max_increase: 5%}\ndecode_mbu: {max_decrease: 10%}\n", "g")


def render(base: Path, new: Path, gates=GATES, **kwargs) -> str:
    pairs = pair_runs(base, new, **kwargs)
    compared = [(p, compare(p.baseline.samples, p.new.samples, gates)) for p in pairs]
    return compare_page.render(compared).html


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("compare-page")
    return write_run(root / "base", seed=1), write_run(root / "slower", seed=2, slowdown=1.5)


@pytest.fixture(scope="module")
def page(folders, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("compare-page-html") / "diff.html"
    path.write_text(render(*folders))
    return path


def figure_svg(html: str, key: str) -> ET.Element:
    start = html.index(f'<figure id="{key}">') + len(f'<figure id="{key}">')
    return ET.fromstring(html[start : html.index("<figcaption>", start)])


def tips(svg: ET.Element) -> list[tuple[str, str]]:
    """(hover text, fill colour) of every mark with a hover text."""
    out = []
    for g in svg.iter("g"):
        if g.get("class") == "tip":
            fill = re.search(r"fill: (#[0-9a-f]{6})", g[1].get("style", ""))
            out.append((g[0].text, fill.group(1) if fill else ""))
    return out


def test_the_page_is_self_contained(page):
    html = page.read_text()
    parser = Tags()
    parser.feed(html)
    names = {tag for tag, _ in parser.tags}
    assert not names & {"script", "link", "iframe", "object", "embed", "img", "a"}
    for tag, attrs in parser.tags:
        assert "src" not in attrs, (tag, attrs)
        assert (attrs.get("href") or "#").startswith("#"), (tag, attrs)
    assert "http://" not in html and "https://" not in html and "xmlns" not in html
    assert set(re.findall(r"url\((.)", html)) == {"#"}
    figures = [attrs["id"] for tag, attrs in parser.tags if tag == "figure"]
    assert figures == ["roofline", "ttft-cdf", "tpot-cdf"]


def test_every_step_of_both_runs_is_a_point_in_its_colour(folders, page):
    html = page.read_text()
    marks = tips(figure_svg(html, "roofline"))
    for side, folder, colour in (("BASE", folders[0], BLUE), ("NEW", folders[1], ORANGE)):
        steps = [line for line in (folder / "steps.jsonl").read_text().splitlines()]
        drawn = [(text, fill) for text, fill in marks if text.startswith(f"{side} ")]
        assert len(drawn) == len(steps) == 16 + 3 * 40 * 16
        assert {fill for _, fill in drawn} == {colour.lower()}
    # A step's numbers, computed by hand: the warm-up's first decode step moves
    # 0.6 × 19 GB/s × 20 ms = 228 MB and computes 270 MFLOP in 20 ms.
    assert "BASE decode step 1: 1 sequences, 20 ms, 1.18 FLOP/B, 13.5GFLOP/s" in dict(marks)


def test_the_cdfs_overlay_both_runs_with_their_quantiles(page):
    html = page.read_text()
    for key in ("ttft-cdf", "tpot-cdf"):
        texts = [text for text, _ in tips(figure_svg(html, key))]
        assert [t.split(":")[0] for t in texts] == [
            "BASE p50",
            "BASE p90",
            "BASE p99",
            "NEW p50",
            "NEW p90",
            "NEW p99",
        ]
    caption = html[html.index('<figure id="tpot-cdf">') :].split("<figcaption>")[1]
    assert caption.startswith("BASE p50 ") and "; NEW p50 " in caption


def test_the_verdict_table_colours_a_regression(page):
    html = page.read_text()
    row = re.search(r"<tr><td>decode_mbu max_decrease 10%</td>.*?</tr>", html).group(0)
    assert f'<td style="color: {RED}; font-weight: 600">regression</td>' in row
    assert "decode_mbu fell" in row and "past the 10% allowed" in row
    assert "<th>95% CI</th>" in html


def test_different_roofs_are_drawn_one_each(folders, tmp_path):
    new = write_run(tmp_path / "other-roofs", seed=3)
    result = read_results(new)
    roofs = dataclasses.replace(result.roofline.roofs, read_bytes_per_s=38e9)
    roofline = dataclasses.replace(result.roofline, roofs=roofs)
    write_results(new, dataclasses.replace(result, roofline=roofline))
    html = render(folders[0], new, gates=default_gates())
    legend = [t.text for t in figure_svg(html, "roofline").iter("text")]
    assert "BASE roof: 19GB/s, 98GFLOP/s" in legend and "NEW roof: 38GB/s, 98GFLOP/s" in legend
    same = render(folders[0], folders[1], gates=default_gates())
    legend = [t.text for t in figure_svg(same, "roofline").iter("text")]
    assert "roof (both): Test CPU (measured): 19GB/s, 98GFLOP/s" in legend


def test_a_sweep_gets_a_section_per_point_with_unique_ids(tmp_path):
    html = render(write_sweep(tmp_path / "a", seed=1), write_sweep(tmp_path / "b", seed=5))
    parser = Tags()
    parser.feed(html)
    ids = [attrs["id"] for _, attrs in parser.tags if "id" in attrs]
    assert len(ids) == len(set(ids))  # the figures' own ids too: prefixed by their point
    sections = [attrs["id"] for tag, attrs in parser.tags if tag in ("h2", "figure")]
    assert sections == [
        "point-1",
        "point-1-roofline",
        "point-1-ttft-cdf",
        "point-1-tpot-cdf",
        "point-2",
        "point-2-roofline",
        "point-2-ttft-cdf",
        "point-2-tpot-cdf",
    ]


def test_a_results_file_alone_has_no_figures(folders, tmp_path):
    base, new = tmp_path / "baseline.json", tmp_path / "new.json"
    base.write_text((folders[0] / "results.json").read_text())
    new.write_text((folders[1] / "results.json").read_text())
    html = render(base, new)
    assert "<figure" not in html
    assert "Neither run has roofline points or latency samples to draw." in html
    assert "<td>tpot_ms.p50 max_increase 5%</td>" in html and "no data" in html


# For the roofline: how many marks of each side Chromium shows, and the hover text found under
# the centre of the first mark of each side that no other mark covers.
SIDES_JS = """(() => {
  const out = {};
  for (const tip of document.querySelectorAll('#roofline .tip')) {
    const text = tip.querySelector('title').textContent;
    const side = text.split(' ')[0];
    const box = tip.getBoundingClientRect();
    out[side] = out[side] || {shown: 0, hovered: null};
    if (box.width > 0 && box.height > 0) out[side].shown += 1;
    if (out[side].hovered === null) {
      tip.scrollIntoView({block: 'center', inline: 'center'});
      const b = tip.getBoundingClientRect();
      const hit = document.elementFromPoint(b.left + b.width / 2, b.top + b.height / 2);
      if (hit && hit.closest('.tip') === tip) out[side].hovered = text;
    }
  }
  return out;
})()"""


def test_the_diff_opens_offline_in_chromium_with_both_runs_points_drawn(page, tmp_path):
    opened = open_in_chromium(page, "figure > svg", tmp_path / "diff.png", expression=SIDES_JS)
    assert opened.console_errors == [] and opened.requests == []
    assert opened.title == "llmbench compare: REGRESSION"
    assert [name for name, _, _ in opened.element_sizes] == ["svg[0]", "svg[1]", "svg[2]"]
    for name, width, height in opened.element_sizes:
        assert width > 300 and height > 200, name
    sides = opened.evaluated
    assert sides.keys() == {"BASE", "NEW"}
    for side in ("BASE", "NEW"):
        assert sides[side]["shown"] == 16 + 3 * 40 * 16
        assert re.fullmatch(rf"{side} (decode|prefill) step \d+: .+FLOP/s", sides[side]["hovered"])
    assert opened.screenshot_bytes > 20_000
