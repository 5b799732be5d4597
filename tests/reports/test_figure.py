"""A matplotlib figure as inline SVG and PNG: hover titles on the right marks, ids unique per
figure, no URL or metadata, the same bytes every time."""

from __future__ import annotations

import io
import re
import xml.etree.ElementTree as ET

import matplotlib
import pytest
from matplotlib.image import imread

from llmbench.reports.figure import PNG_DPI, Plot, hover, new_axes, png, styled, svg


@styled
def _plot(key: str = "demo") -> Plot:
    figure, ax = new_axes((4.0, 3.0), "Demo <&>", "x", "y")
    points = ax.scatter([1, 2, 3], [1, 4, 9], s=[10, 20, 30])  # varied sizes: one path each
    hover(points, ["one", "two", "three"])
    bars = ax.bar([5, 6], [2, 3])
    hover(bars, ["bar <a>", "bar & b"])
    ax.plot([1, 6], [1, 9], label="line")
    return Plot(key, figure, "caption")


def test_hover_texts_become_titles_on_their_marks_in_order():
    root = ET.fromstring(svg(_plot()))
    tips = [g for g in root.iter("g") if g.get("class") == "tip"]
    assert [g[0].tag for g in tips] == ["title"] * 5  # the title leads its mark
    assert [g[0].text for g in tips] == ["one", "two", "three", "bar <a>", "bar & b"]
    assert all(g.find("path") is not None or g.find("use") is not None for g in tips)
    assert root.find("title").text == "Demo <&>"  # the figure's own title, as before
    assert not list(root.iter("a"))  # no link left


def test_many_points_drawn_as_markers_keep_their_titles():
    # Over a few dozen equal points matplotlib draws one marker definition and <use>s of it.
    figure, ax = new_axes((4.0, 3.0), "t", "x", "y")
    hover(ax.scatter(range(200), range(200)), [f"p{i}" for i in range(200)])
    root = ET.fromstring(svg(Plot("many", figure, "")))
    tips = [g for g in root.iter("g") if g.get("class") == "tip"]
    assert [g[0].text for g in tips] == [f"p{i}" for i in range(200)]
    assert all(g.find(".//use").get("href").startswith("#many-") for g in tips)


def test_svg_names_no_url_namespace_or_metadata_and_ids_are_prefixed():
    text = svg(_plot("fig"))
    assert text.startswith("<svg ") and "<?xml" not in text and "DOCTYPE" not in text
    for absent in ("http", "xmlns", "xlink", "metadata", "Matplotlib", "<a "):
        assert absent not in text, absent
    root = ET.fromstring(text)
    ids = {e.get("id") for e in root.iter() if e.get("id")}
    assert ids and all(i.startswith("fig-") for i in ids)
    refs = re.findall(r'url\(#([^)]+)\)|href="#([^"]+)"', text)
    assert refs and {a or b for a, b in refs} <= ids  # every reference resolves inside


def test_svg_text_is_real_text_in_the_house_font():
    root = ET.fromstring(svg(_plot()))
    texts = [t for t in root.iter("text")]
    assert "Demo <&>" in [t.text for t in texts]
    assert all("DejaVu Sans" in t.get("style") for t in texts)


def test_same_figure_same_bytes():
    assert svg(_plot()) == svg(_plot())  # clip-path and marker ids are salted hashes, not random
    assert png(_plot()) == png(_plot())


def test_png_decodes_at_the_figure_size_and_carries_no_software_tag():
    data = png(_plot())
    image = imread(io.BytesIO(data), format="png")
    assert image.shape[:2] == (3 * PNG_DPI, 4 * PNG_DPI)  # 4 x 3 inches
    assert b"matplotlib" not in data.lower()


def test_building_leaves_matplotlibs_global_settings_alone():
    before = dict(matplotlib.rcParams)
    svg(_plot())
    assert dict(matplotlib.rcParams) == before


def test_hover_needs_a_text_per_artist():
    figure, ax = new_axes((2.0, 2.0), "t", "x", "y")
    with pytest.raises(ValueError):
        hover(ax.bar([1, 2], [1, 1]), ["only one"])
