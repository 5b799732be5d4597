"""A sweep's point folders: their names, the loads read back from them, and sweep order."""

from __future__ import annotations

import pytest

from llmbench.harness.sweep_folders import point_folders, point_load, point_name


@pytest.mark.parametrize(
    ("load", "name"), [(4, "point-4"), (4.0, "point-4"), (0.5, "point-0.5"), (1e6, "point-1e+06")]
)
def test_a_load_names_its_folder_and_the_name_gives_it_back(load, name):
    assert point_name(load) == name
    assert point_load(name) == load


@pytest.mark.parametrize(
    "name", ["point-", "point-four", "point-nan", "point-inf", "points", "variants", "round-01"]
)
def test_other_names_carry_no_load(name):
    assert point_load(name) is None


def test_points_come_in_load_order_not_name_order(tmp_path):
    for name in ("point-10", "point-2", "point-0.5", "point-100"):
        (tmp_path / name).mkdir()
    (tmp_path / "point-3").write_text("a file, not a point")
    (tmp_path / "point-x").mkdir()
    (tmp_path / "export").mkdir()
    assert [p.name for p in point_folders(tmp_path)] == [
        "point-0.5",
        "point-2",
        "point-10",
        "point-100",
    ]


def test_a_folder_without_points_or_no_folder_has_none(tmp_path):
    assert point_folders(tmp_path) == []
    assert point_folders(tmp_path / "absent") == []
