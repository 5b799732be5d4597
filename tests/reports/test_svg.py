"""The SVG chart maker: scales, ticks, number labels and where marks land, by hand."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest

from llmbench.reports.svg import Chart, Scale, si


@pytest.mark.parametrize(
    "value, unit, text",
    [
        (1234, "", "1.23k"),
        (2.5e12, "FLOP/s", "2.5TFLOP/s"),
        (18.2e9, "B/s", "18.2GB/s"),
        (0.5, "", "0.5"),
        (0, "", "0"),
        (999, "", "999"),
    ],
)
def test_si_prefixes(value, unit, text):
    assert si(value, unit) == text


def test_linear_scale_ticks_are_round_steps():
    assert Scale(0, 10).ticks() == [0, 2, 4, 6, 8, 10]  # 10/6 → a step of 2
    assert Scale(0, 0.7).ticks() == pytest.approx([0, 0.2, 0.4, 0.6])  # 0.7/6 → 0.2
    assert Scale(0, 10).frac(2.5) == 0.25


def test_log_scale_ticks_are_decades():
    scale = Scale(1, 1000, is_log=True)
    assert scale.ticks() == [1, 10, 100, 1000]
    assert scale.frac(10) == pytest.approx(1 / 3)
    assert scale.frac(1000) == pytest.approx(1.0)


def test_fit_holds_every_value():
    assert Scale.fit([3, 7]) == Scale(0, 7 + 7 * 0.05)  # from zero, with 5 % headroom
    assert Scale.fit([0.02, 300], is_log=True) == Scale(0.01, 1000, True)  # whole decades
    assert Scale.fit([-1.0, 0.0, 5.0], is_log=True) == Scale(1.0, 10.0, True)  # positives only
    assert Scale.fit([]) == Scale(0.0, 1.0)


def _parse(svg: str) -> ET.Element:
    return ET.fromstring(svg)  # well-formed XML, or this raises


def test_marks_land_where_the_scales_put_them():
    # Margins: left 64, right 16, top 30, bottom 44 → a 200 x 200 plot area at (64, 30).
    chart = Chart("t", "x", "y", Scale(0, 10), Scale(0, 10), width=280, height=274)
    chart.line([0, 10], [0, 10], "#000", "diagonal")
    chart.points([5], [5], "#f00", radii=[2.0])
    root = _parse(chart.svg())
    plot = root.find("svg")  # the clipped plot area
    assert plot.find("polyline").get("points") == "64.0,230.0 264.0,30.0"
    circle = plot.find("g/circle")
    assert (circle.get("cx"), circle.get("cy"), circle.get("r")) == ("164.0", "130.0", "2.0")
    assert any(t.text == "diagonal" for t in root.iter("text"))  # the legend


def test_step_line_holds_each_value_until_the_next():
    chart = Chart("t", "x", "y", Scale(0, 10), Scale(0, 10), width=280, height=274)
    chart.line([0, 5, 10], [0, 10, 5], "#000", step=True)
    points = _parse(chart.svg()).find("svg/polyline").get("points").split()
    # (0,0) → across to x=5 at y=0 → up to 10 → across to x=10 → down to 5
    assert points == ["64.0,230.0", "164.0,230.0", "164.0,30.0", "264.0,30.0", "264.0,130.0"]


def test_values_a_log_axis_cannot_show_are_dropped():
    chart = Chart("t", "x", "y", Scale(1, 100, True), Scale(1, 100, True))
    chart.points([0.0, -1.0, 10.0], [10.0, 10.0, 10.0], "#000")
    assert len(_parse(chart.svg()).findall("svg/g/circle")) == 1


def test_text_is_escaped():
    chart = Chart("a < b & c", "x", "y", Scale(0, 1), Scale(0, 1))
    chart.label(0.5, 0.5, "<script>")
    root = _parse(chart.svg())
    assert root.find("title").text == "a < b & c"
    assert "<script>" not in chart.svg()


def test_histogram_bars_span_their_bins():
    chart = Chart("t", "x", "y", Scale(0, 10), Scale(0, 10), width=280, height=274)
    chart.bars([0, 5, 10], [10, 0], "#000")  # an empty bin draws nothing
    (rect,) = _parse(chart.svg()).findall("svg/g/rect")
    assert (rect.get("x"), rect.get("y"), rect.get("height")) == ("64.0", "30.0", "200.0")
    assert rect.get("width") == "99.5"  # 100 px bin less a 0.5 px gap
