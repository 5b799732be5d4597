"""Write `report.html` (+ `figures/*.png`) and `report.md` into a run or sweep folder from its
files."""

from __future__ import annotations

from pathlib import Path

from llmbench.errors import UserError
from llmbench.reports import html_report, markdown_report, rundata


def write_reports(folder: Path) -> tuple[Path, Path]:
    """Render both reports of `folder`; a sweep folder gets the sweep's and every point's."""
    if (folder / "results.json").is_file():
        run = rundata.load(folder)
        page, markdown = html_report.render(run), markdown_report.render(run)
    else:
        points = rundata.sweep_points(folder)
        if not points:
            raise UserError(
                f"{folder}: no results.json and no sweep points here; pass a folder that "
                "`llmbench run` wrote"
            )
        for point in points:
            write_reports(point.folder)
        page = html_report.render_sweep(folder.name, points)
        markdown = markdown_report.render_sweep(folder.name, points)
    md_path = folder / "report.md"
    md_path.write_text(markdown + "\n")
    return page.write(folder / "report.html"), md_path
