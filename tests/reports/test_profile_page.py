"""The profile page from a profile's data alone: a bar chart and a roofline per point, the
table, and a page that opens offline in a real browser with hover texts on its marks."""

from __future__ import annotations

import re

from llmbench.reports.profile_page import render, table_rows
from tests.reports.browser import open_in_chromium


def op(name, ms, num_bytes, flops, bandwidth=10e9, peak=100e9):
    bound = 1e3 * max(num_bytes / bandwidth, flops / peak)
    return {
        "op": name,
        "calls_per_step": 2.0,
        "ms_per_step": ms,
        "share": ms / 10.0,
        "bytes": num_bytes,
        "flops": flops,
        "bytes_per_s": num_bytes / (ms / 1e3),
        "flops_per_s": flops / (ms / 1e3),
        "bound_ms": bound,
        "roof_fraction": bound / ms,
        "lost_ms": ms - bound,
        "aten_ops": {"aten::mm": 2},
    }


def result():
    """A 10 ms step: a 4 ms qkv_proj of 20 MB (2 ms bound), a 1 ms rope (no cost), a 3 ms
    attention of 5 MB and 0.2 GFLOP, 2 ms unattributed."""
    ops = [op("qkv_proj", 4.0, 20e6, 40e6), op("rope", 1.0, 0.0, 0.0)]
    ops.append(op("attention", 3.0, 5e6, 0.2e9))
    point = {
        "batch": 4,
        "context": 512,
        "ops": ops,
        "step_ms": 10.0,
        "step_ms_unprofiled": 9.0,
        "bytes": 25e6,
        "flops": 0.24e9,
        "bytes_per_s": 2.5e9,
        "flops_per_s": 24e9,
        "bound_ms": 2.5,
        "roof_fraction": 0.25,
        "lost_ms": 7.5,
        "attributed_ms": 8.0,
        "unattributed_ms": 2.0,
        "attributed_fraction": 0.8,
        "steps": [],
        "warnings": ["above their own roof: nothing (a test line)"],
    }
    return {
        "model": "synthetic:tiny",
        "dtype": "bfloat16",
        "phase": "decode",
        "device": "cpu0",
        "threads": 2,
        "num_steps": 2,
        "roofs": {
            "read_bytes_per_s": 10e9,
            "flops_per_s": 100e9,
            "sources": {"read_bytes_per_s": "probe read: given", "read": "given"},
        },
        "loadavg_1m_before": 0.5,
        "loadavg_1m_after": 0.7,
        "cpu_count": 2,
        "points": [point],
    }


def test_the_table_rows_and_the_step():
    rows = table_rows(result()["points"][0])
    assert rows[0] == [
        "qkv_proj", "2", "4.000", "40.0%", "20.00", "5.0", "10.0", "2.000", "50%", "2.000"
    ]  # fmt: skip
    assert rows[1][0] == "rope" and rows[1][7:] == ["0.000", "0%", "1.000"]
    assert [r[0] for r in rows[3:]] == ["attributed", "unattributed (Python, dispatch)", "step"]
    assert rows[-1][2:4] == ["10.000", "100%"] and rows[-1][8:] == ["25%", "7.500"]


def test_the_page_opens_offline_with_its_figures_and_hover_texts(tmp_path):
    page = render(result())
    assert [plot.key for plot in page.plots] == [
        "profile-time-b4-c512",
        "profile-roofline-b4-c512",
    ]
    html = page.write(tmp_path / "profile.html").read_text()
    assert not re.search(r"(src|href)=\"https?:", html)  # nothing fetched from outside
    assert "Not on it (no FLOPs or no bytes in the cost model): rope." in html
    assert "9 ms per step without the profiler" in html
    assert "above their own roof: nothing (a test line)" in html
    shown = open_in_chromium(
        tmp_path / "profile.html",
        "figure > svg",
        tmp_path / "shot.png",
        expression="Array.from(document.querySelectorAll('.tip > title')).map(t => t.textContent)",
    )
    assert shown.console_errors == [] and shown.requests == []
    assert [name for name, _, _ in shown.element_sizes] == ["svg[0]", "svg[1]"]
    for _, width, height in shown.element_sizes:
        assert width > 300 and height > 100
    tips = shown.evaluated
    assert "qkv_proj: 4 ms per step, bound 2 ms, lost 2 ms" in tips
    assert "unattributed (Python, dispatch): 2 ms per step" in tips
    assert any(t.startswith("whole step: 10 ms per step, 25MB") for t in tips), tips


BUSY = (
    "the machine was busy: other processes used 0.90 cores just before the profile and 1.00 "
    "during it (of 2); the numbers are pessimistic"
)


def test_a_profile_on_a_busy_machine_says_so_first():
    from llmbench.roofline import profile_table

    busy = {**result(), "warnings": [BUSY]}
    text = profile_table.lines(busy)
    assert text[1] == f"warning: {BUSY}" and text[3] == "batch 4, context 512"
    html = render(busy).html
    box = f'<p class="warn">{BUSY[0].upper()}{BUSY[1:]}.</p>'
    assert box in html and html.index(box) < html.index("<h2>")
    assert '<p class="warn">' not in render(result()).html  # quiet, or from before warnings
    assert not any(line.startswith("warning:") for line in profile_table.lines(result()))
