"""Write `report.html` (+ `figures/*.png`) and `report.md` into a run, sweep or variants folder
from its files; a write that fails (a full disk) is an OSError that names the file, which the
CLI prints as one line."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from llmbench.harness import variant_index
from llmbench.reports import html_report, markdown_report, rundata, variants_page


def write_reports(folder: Path) -> tuple[Path, Path]:
    """Render both reports of `folder`; a sweep folder gets the sweep's and every point's, a
    variants folder (`variants.json`) the side-by-side page and every variant's own."""
    if variant_index.is_variants_folder(folder):
        for entry in variant_index.read_index(folder).variants:
            sub = folder / entry.folder
            if (sub / "results.json").is_file():  # a variant that failed early has none
                write_reports(sub)
        with _writing(folder / "report.html"):
            return variants_page.write_variants_report(folder)
    if (folder / "results.json").is_file():
        run = rundata.load(folder)
        page, markdown = html_report.render(run), markdown_report.render(run)
    else:
        points = list(rundata.runs_in(folder).values())  # a sweep's, or one line saying why not
        for point in points:
            write_reports(point.folder)
        page = html_report.render_sweep(folder.name, points)
        markdown = markdown_report.render_sweep(folder.name, points)
    md_path = folder / "report.md"
    with _writing(md_path):
        md_path.write_text(markdown + "\n")
    with _writing(folder / "report.html"):
        return page.write(folder / "report.html"), md_path


@contextlib.contextmanager
def _writing(path: Path) -> Iterator[None]:
    """An OSError writing `path` names it: a failed write (ENOSPC) says no file by itself."""
    try:
        yield
    except OSError as e:
        if e.filename:
            raise
        raise OSError(e.errno, e.strerror, str(path)) from None
