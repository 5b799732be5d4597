"""The headless-Chromium helper itself: sizes, console errors, outside requests, screenshot."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.reports import browser
from tests.reports.browser import open_in_chromium


def write_page(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "page.html"
    path.write_text(f"<!doctype html><html><head><title>t</title></head><body>{body}</body></html>")
    return path


def test_measures_inline_svg_figures_without_errors_or_requests(tmp_path: Path) -> None:
    page = write_page(
        tmp_path,
        '<figure><svg id="wide" width="300" height="200"><rect width="10" height="10"/></svg>'
        "</figure>"
        '<figure><svg width="400" height="100"></svg></figure>',
    )
    shot = tmp_path / "shot.png"
    report = open_in_chromium(page, "figure svg", shot)
    assert report.element_sizes == [("wide", 300.0, 200.0), ("svg[1]", 400.0, 100.0)]
    assert report.console_errors == []
    assert report.requests == []
    assert report.title == "t"
    # The SVGs (200 + 100 px) plus figure margins and line gaps, not the 900 px viewport.
    assert 300 < report.page_height < 400
    png = shot.read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n")
    assert len(png) == report.screenshot_bytes > 0


def test_evaluates_an_expression_in_the_loaded_page(tmp_path: Path) -> None:
    # What a hover would find: the element under a point, and the <title> of its group.
    page = write_page(
        tmp_path,
        '<svg width="100" height="100"><g class="tip"><title>p50: 3 ms</title>'
        '<rect x="0" y="0" width="100" height="100"/></g></svg>',
    )
    expression = "document.elementFromPoint(50, 50).closest('.tip').querySelector('title')"
    report = open_in_chromium(
        page, "svg", tmp_path / "shot.png", expression=f"{expression}.textContent"
    )
    assert report.evaluated == "p50: 3 ms"
    with pytest.raises(ValueError, match="evaluating failed"):
        open_in_chromium(page, "svg", tmp_path / "shot.png", expression="nope()")


def test_reports_console_error(tmp_path: Path) -> None:
    page = write_page(tmp_path, '<script>console.error("boom")</script>')
    report = open_in_chromium(page, "svg", tmp_path / "shot.png")
    assert report.console_errors == ["boom"]
    assert report.element_sizes == []


def test_reports_uncaught_exception(tmp_path: Path) -> None:
    page = write_page(tmp_path, '<script>throw new Error("kaput")</script>')
    report = open_in_chromium(page, "svg", tmp_path / "shot.png")
    assert len(report.console_errors) == 1
    assert "kaput" in report.console_errors[0]


def test_detects_outside_request_with_network_off(tmp_path: Path) -> None:
    # The fetch fails (the proxy port is closed), but the attempt is what a test must see.
    # A data: image never leaves the page, so it is not a request.
    page = write_page(
        tmp_path,
        '<img src="https://cdn.example.com/x.png">'
        '<img src="data:image/gif;base64,R0lGODlhAQABAAAAACw=">',
    )
    report = open_in_chromium(page, "img", tmp_path / "shot.png")
    assert report.requests == ["https://cdn.example.com/x.png"]


def test_hung_page_times_out_instead_of_hanging(tmp_path: Path) -> None:
    # The load event never fires, so the deadline must end the run (and the browser).
    page = write_page(tmp_path, "<script>while (true) {}</script>")
    with pytest.raises(TimeoutError, match=r"did not load .* \(stalled loading the page\)"):
        open_in_chromium(page, "svg", tmp_path / "shot.png", timeout_s=2)


def test_a_stalled_start_is_tried_again_fresh(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # The first start never opens its DevTools port (as a start stalled on a busy machine);
    # the second is the real browser, and the page is measured as usual.
    marker = tmp_path / "started-once"
    stalling = tmp_path / "chromium-stalls-once"
    stalling.write_text(
        f"#!/bin/sh\nif [ ! -e {marker} ]; then touch {marker}; exec sleep 60; fi\n"
        f'exec {browser.find_chromium()} "$@"\n'
    )
    stalling.chmod(0o755)
    monkeypatch.setattr(browser, "find_chromium", lambda: str(stalling))
    monkeypatch.setattr(browser, "START_TIMEOUTS_S", (1.0, 120.0))
    report = open_in_chromium(
        write_page(tmp_path, '<svg width="40" height="30"></svg>'), "svg", tmp_path / "s.png"
    )
    assert marker.exists()
    assert report.element_sizes == [("svg[0]", 40.0, 30.0)]


def test_a_start_that_always_stalls_is_a_timeout(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    stalling = tmp_path / "chromium-stalls"
    stalling.write_text("#!/bin/sh\nexec sleep 60\n")
    stalling.chmod(0o755)
    monkeypatch.setattr(browser, "find_chromium", lambda: str(stalling))
    monkeypatch.setattr(browser, "START_TIMEOUTS_S", (0.5, 1.0))
    with pytest.raises(TimeoutError, match=r"DevTools port in 0.5 s, 1 s \(2 starts\)"):
        open_in_chromium(write_page(tmp_path, ""), "svg", tmp_path / "s.png")


def test_missing_chromium_says_how_to_install(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(browser.shutil, "which", lambda name: None)
    monkeypatch.setattr(browser, "DEBIAN_CHROMIUM", tmp_path / "no-chromium")
    with pytest.raises(RuntimeError, match="apt-get install -y chromium"):
        browser.find_chromium()


def test_missing_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no HTML file"):
        open_in_chromium(tmp_path / "absent.html", "svg", tmp_path / "shot.png")
