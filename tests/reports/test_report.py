"""report.html / report.md from a real run folder: self-contained, populated by real steps, and
re-renderable without torch."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from html.parser import HTMLParser

from matplotlib.image import imread

from llmbench.reports.figure import PNG_DPI
from llmbench.reports.tables import si
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
    # Nothing to fetch and nothing to run: no script, stylesheet link, frame, image or link.
    assert not names & {"script", "link", "iframe", "object", "embed", "img", "a"}
    for tag, attrs in parser.tags:
        assert "src" not in attrs and "srcset" not in attrs, (tag, attrs)
        # The only references are a figure's own marker definitions, inside the page.
        assert (attrs.get("href") or "#").startswith("#"), (tag, attrs)
    assert "http://" not in html and "https://" not in html and "xmlns" not in html
    assert set(re.findall(r"url\((.)", html)) == {"#"}  # clip paths inside the page
    figures = {attrs["id"] for tag, attrs in parser.tags if tag == "figure"}
    assert figures == RUN_FIGURES
    for key in figures:  # each figure is an inline SVG document, well-formed
        assert _figure_svg(html, key).tag == "svg"


def _figure_svg(html: str, key: str) -> ET.Element:
    start = html.index(f'<figure id="{key}">') + len(f'<figure id="{key}">')
    end = html.index("<figcaption>", start)
    return ET.fromstring(html[start:end])


def test_roofline_has_a_point_per_engine_step_with_its_numbers_on_hover(run_folder):
    html = (run_folder / "report.html").read_text()
    steps = [json.loads(line) for line in (run_folder / "steps.jsonl").read_text().splitlines()]
    measured = [s for s in steps if s.get("repetition", 1) >= 1]  # no warm-up, as the table
    assert len(measured) < len(steps)  # the run warmed up: its steps are in steps.jsonl
    drawn = [s for s in measured if s["t_end_ns"] > s["t_start_ns"] and s["bytes"] and s["flops"]]
    tips = [g for g in _figure_svg(html, "roofline").iter("g") if g.get("class") == "tip"]
    expected = []
    for i, step in enumerate(steps):
        if step in drawn:
            seconds = (step["t_end_ns"] - step["t_start_ns"]) / 1e9
            expected.append(
                f"{step['phase']} step {i}: {step['num_seqs']} sequences, "
                f"{seconds * 1e3:.3g} ms, {step['flops'] / step['bytes']:.3g} FLOP/B, "
                f"{si(step['flops'] / seconds, 'FLOP/s')}"
            )
    assert sorted(g[0].text for g in tips) == sorted(expected) and expected


def test_every_figure_is_also_a_png_of_the_same_figure(run_folder):
    html = (run_folder / "report.html").read_text()
    assert sorted(p.stem for p in (run_folder / "figures").iterdir()) == sorted(RUN_FIGURES)
    for key in RUN_FIGURES:
        image = imread(run_folder / "figures" / f"{key}.png")
        _, _, width_pt, height_pt = map(float, _figure_svg(html, key).get("viewBox").split())
        assert image.shape[:2] == (
            round(height_pt / 72 * PNG_DPI),
            round(width_pt / 72 * PNG_DPI),
        ), key


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
    for png in (run_folder / "figures").iterdir():  # the same bytes: no date, no random id
        assert (copy / "figures" / png.name).read_bytes() == png.read_bytes()


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


# For each figure: the hover text Chromium finds under the centre of its first mark that is
# not covered by another one (null: no mark is hoverable).
HOVER_JS = """(() => Array.from(document.querySelectorAll('figure')).map(figure => {
  for (const tip of figure.querySelectorAll('.tip')) {
    tip.scrollIntoView({block: 'center', inline: 'center'});
    const box = tip.getBoundingClientRect();
    const hit = document.elementFromPoint(box.left + box.width / 2, box.top + box.height / 2);
    const text = tip.querySelector('title').textContent;
    if (hit && hit.closest('.tip') === tip) return [figure.id, text];
  }
  return [figure.id, null];
}))()"""


def test_report_opens_offline_in_chromium(run_folder, tmp_path):
    """Headless Chromium, network off: every figure renders as an inline SVG with a size,
    hovering a point or bar shows its numbers, nothing is fetched, no console error."""
    page = open_in_chromium(
        run_folder / "report.html", "figure > svg", tmp_path / "report.png", expression=HOVER_JS
    )
    assert page.console_errors == []
    assert page.requests == []
    assert len(page.element_sizes) == len(RUN_FIGURES)
    for name, width, height in page.element_sizes:
        assert width > 300 and height > 100, name
    assert page.page_height > sum(height for _, _, height in page.element_sizes)
    hovered = dict(page.evaluated)
    assert hovered.keys() == RUN_FIGURES
    # Points and bars carry hover texts; lines (tokens/s, sequences, telemetry) do not, and the
    # KV panel only on its preemption marks (none in this run).
    assert {k for k, text in hovered.items() if text is None} == {
        "timeline-tokens",
        "timeline-sequences",
        "timeline-kv",
        "timeline-telemetry",
    }
    assert re.fullmatch(
        r"(decode|prefill|mixed) step \d+: \d+ sequences, .+ FLOP/B, .+FLOP/s", hovered["roofline"]
    )
    assert re.fullmatch(r"p50: [0-9.]+ ms", hovered["ttft-cdf"])
    assert re.fullmatch(r"[0-9.]+–[0-9.]+ ms: \d+ tokens", hovered["itl-histogram"])
    assert re.fullmatch(r"s0-t0: first token [0-9.]+ ms", hovered["sessions"])
    assert page.screenshot_bytes > 20_000
    assert (tmp_path / "report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# A full disk: every Path.write_text / write_bytes (results.json, report.md, report.html, the
# figures) fails with ENOSPC and 0 bytes free; then the real CLI runs.
FULL_DISK = """
import errno, pathlib, shutil, sys, types
def full(self, *args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")
pathlib.Path.write_text = pathlib.Path.write_bytes = full
shutil.disk_usage = lambda path: types.SimpleNamespace(total=204800, used=204800, free=0)
from llmbench.cli.main import main
sys.argv = ["llmbench", *sys.argv[1:]]
main()
"""


def test_report_on_a_full_disk_is_one_line(tmp_path):
    """Before: an OSError traceback. Now one line naming the file, exit 1: for the reports of
    a run, and for the results.json of a run killed (or stopped by a full disk) before it
    wrote one."""
    from tests.harness.synthetic_runs import write_run

    whole = write_run(tmp_path / "whole", seed=1)
    cut = write_run(tmp_path / "cut", seed=2)
    (cut / "results.json").rename(cut / "run-start.json")
    for folder, path in ((whole, whole / "report.md"), (cut, cut / "results.json")):
        result = subprocess.run(
            [sys.executable, "-c", FULL_DISK, "report", str(folder)],
            capture_output=True,
            text=True,
        )
        assert result.returncode == 1, result.stderr
        assert result.stderr.splitlines() == [
            f"error: {path}: cannot write (No space left on device; 0 B free there); free some "
            "space and try again"
        ]
