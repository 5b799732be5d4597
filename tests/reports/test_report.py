"""report.html / report.md from a real run folder: self-contained, populated by real steps, and
re-renderable without torch."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from html.parser import HTMLParser

from tests.harness.test_run import llmbench
from tests.reports.browser import open_in_chromium

# Every figure a single engine run of the agentic workload must have.
RUN_FIGURES = {
    "roofline",
    "ttft-cdf",
    "tpot-cdf",
    "itl-histogram",
    "timeline-tokens",
    "timeline-sequences",
    "timeline-kv",
    "timeline-prefix",
    "timeline-telemetry",
    "timeline-utilisation",
    "sessions",
}


class Tags(HTMLParser):
    """Every start tag with its attributes, and the figure ids."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))


def test_run_writes_a_self_contained_report(run_folder):
    html = (run_folder / "report.html").read_text()
    parser = Tags()
    parser.feed(html)
    names = {tag for tag, _ in parser.tags}
    # Nothing to fetch and nothing to run: no script, stylesheet link, frame or external image.
    assert not names & {"script", "link", "iframe", "object", "embed"}
    for tag, attrs in parser.tags:
        if tag == "img":
            assert (attrs.get("src") or "").startswith("data:"), attrs
        for key in ("src", "href", "xlink:href", "srcset"):
            assert key not in attrs, (tag, attrs)
    assert "http://" not in html and "https://" not in html and "url(" not in html
    figures = {attrs["id"] for tag, attrs in parser.tags if tag == "figure"}
    assert figures == RUN_FIGURES
    for key in figures:  # each figure is an inline SVG document, well-formed
        assert _figure_svg(html, key).tag == "svg"


def _figure_svg(html: str, key: str) -> ET.Element:
    start = html.index(f'<figure id="{key}">') + len(f'<figure id="{key}">')
    end = html.index("<figcaption>", start)
    return ET.fromstring(html[start:end])


def test_roofline_has_a_point_per_engine_step(run_folder):
    html = (run_folder / "report.html").read_text()
    steps = [json.loads(line) for line in (run_folder / "steps.jsonl").read_text().splitlines()]
    drawn = [s for s in steps if s["t_end_ns"] > s["t_start_ns"]]
    plot = _figure_svg(html, "roofline").find("svg")  # the plot area (the legend is outside)
    assert len(plot.findall("g/circle")) == len(drawn) > 0
    # The measured roof: a polyline whose flat part sits at the measured peak.
    results = json.loads((run_folder / "results.json").read_text())
    roofs = results["roofline"]["roofs"]
    assert roofs["read_bytes_per_s"] == results["provenance"]["hardware"]["read_bytes_per_s"]
    assert plot.findall("polyline")


def test_markdown_report_carries_the_summary(run_folder):
    md = (run_folder / "report.md").read_text()
    results = json.loads((run_folder / "results.json").read_text())
    summary = results["summary"]
    assert md.startswith("# llmbench: agentic")
    assert f"| decode MBU | {summary['decode_mbu']:.2f} |" in md
    assert f"| prefill MFU | {summary['prefill_mfu']:.2f} |" in md
    assert f"| ttft_ms | {summary['ttft_ms']['mean']:,.1f} |" in md
    decode = results["roofline"]["phases"]["decode"]
    assert f"| decode | {decode['num_steps']:,.0f} |" in md
    assert "| slo.ttft_ms" not in md and "| ttft_ms | <= 200 ms |" in md


def test_report_rerenders_without_torch(run_folder, tmp_path):
    """`llmbench report` on a laptop without torch: block the import and render again."""
    copy = tmp_path / "copy"
    shutil.copytree(run_folder, copy)
    (copy / "report.html").unlink()
    (copy / "report.md").unlink()
    code = (
        "import sys; sys.modules['torch'] = None; sys.modules['transformers'] = None; "
        "from llmbench.cli.main import main; "
        f"sys.argv = ['llmbench', 'report', {str(copy)!r}]; main()"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [str(copy / "report.html"), str(copy / "report.md")]
    assert (copy / "report.html").read_text() == (run_folder / "report.html").read_text()
    assert (copy / "report.md").read_text() == (run_folder / "report.md").read_text()


def test_report_of_a_folder_without_results_is_one_line(tmp_path):
    result = llmbench("report", str(tmp_path))
    assert result.returncode == 2
    assert result.stderr.strip() == (
        f"error: {tmp_path}: no results.json and no sweep points here; pass a folder that "
        "`llmbench run` wrote"
    )
    (tmp_path / "results.json").write_text("{not json")
    result = llmbench("report", str(tmp_path))
    assert result.returncode == 2 and "results.json: not valid JSON" in result.stderr
    assert "Traceback" not in result.stderr


def test_report_opens_offline_in_chromium(run_folder, tmp_path):
    """Headless Chromium, network off: every figure renders with a size, nothing is fetched,
    no console error."""
    page = open_in_chromium(run_folder / "report.html", "figure > svg", tmp_path / "report.png")
    assert page.console_errors == []
    assert page.requests == []
    assert len(page.element_sizes) == len(RUN_FIGURES)
    for name, width, height in page.element_sizes:
        assert width > 100 and height > 100, name
    assert page.screenshot_bytes > 20_000
    assert (tmp_path / "report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
