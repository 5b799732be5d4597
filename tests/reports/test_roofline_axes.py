"""Roofline axes: whole decades that hold every point, roofs and their ridge."""

from __future__ import annotations

from matplotlib.figure import Figure

from llmbench.reports.roofline_axes import decades, draw_roof, log_axes, marker_area


def test_decades_hold_every_positive_value():
    assert decades([0.02, 300]) == (0.01, 1000)
    assert decades([-1.0, 0.0, 5.0]) == (1.0, 10.0)  # one decade at least; positives only
    assert decades([]) == (1.0, 10.0)
    assert decades([1e9, 2e12]) == (1e9, 1e13)


def test_a_roof_is_flat_past_its_ridge_and_a_dashed_roof_has_no_ridge_line():
    ax = Figure().add_subplot()
    log_axes(ax, [1, 1000], [1e9, 1e12])
    draw_roof(ax, "solid", 1e9, 1e11)  # ridge at 100 FLOP/B
    draw_roof(ax, "sheet", 2e9, 4e11, linestyle="--")
    solid, sheet = ax.lines
    assert solid.get_xdata().tolist() == [1, 100, 1000]
    assert solid.get_ydata().tolist() == [1e9, 1e11, 1e11]
    assert sheet.get_ydata().tolist() == [2e9, 4e11, 4e11]
    assert solid.get_color() == "#222222"  # roofs are near-black unless told otherwise
    assert len(ax.collections) == 1  # one dotted ridge line: the solid roof's
    assert [t.get_text() for t in ax.texts] == ["ridge 100 FLOP/B"]
    assert ax.xaxis.get_major_formatter()(1e9, 0) == "1G"


def test_marker_area_grows_with_the_square_root_of_the_batch():
    assert marker_area(1) == 22 and marker_area(16) == 58
