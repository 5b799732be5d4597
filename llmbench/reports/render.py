"""Write `report.html` and `report.md` into a run folder (or a sweep folder) from its files."""

from __future__ import annotations

from pathlib import Path

from llmbench.errors import UserError
from llmbench.reports import html_report, markdown_report, rundata


def write_reports(folder: Path) -> tuple[Path, Path]:
    """Render both reports of `folder`; a sweep folder gets the sweep's and every point's."""
    if (folder / "results.json").is_file():
        run = rundata.load(folder)
        html, markdown = html_report.render(run), markdown_report.render(run)
    else:
        points = rundata.sweep_points(folder)
        if not points:
            raise UserError(
                f"{folder}: no results.json and no sweep points here; pass a folder that "
                "`llmbench run` wrote"
            )
        for point in points:
            write_reports(point.folder)
        html = html_report.render_sweep(folder.name, points)
        markdown = markdown_report.render_sweep(folder.name, points)
    html_path, md_path = folder / "report.html", folder / "report.md"
    html_path.write_text(html)
    md_path.write_text(markdown + "\n")
    return html_path, md_path
