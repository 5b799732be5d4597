"""What a step's child process hands back: one JSON object per line in `<work>/<step>.jsonl`,
appended and flushed as each result is measured, so a child killed at its time box (or by a
crash) still leaves everything it measured before.

A record is `{"part": <name>, ...}`: a result row (`"row": {...}`), a part skipped
(`"skipped": <why>`), or a part failed (`"error": <one line>`).
"""

from __future__ import annotations

import json
import traceback
from pathlib import Path
from typing import Any


class PartWriter:
    """Appends records to one step's file."""

    def __init__(self, path: Path):
        self.path = path

    def write(self, part: str, **fields: Any) -> None:
        with self.path.open("a") as out:
            out.write(json.dumps({"part": part, **fields}, default=str) + "\n")

    def row(self, part: str, row: dict[str, Any]) -> None:
        self.write(part, row=row)

    def skipped(self, part: str, why: str) -> None:
        self.write(part, skipped=why)

    def error(self, part: str, error: BaseException) -> None:
        """The error as one line, and the traceback for the log (printed, not recorded)."""
        traceback.print_exception(error)
        self.write(part, error=error_line(error))


def error_line(error: BaseException) -> str:
    """`TypeName: message`, on one line."""
    message = " ".join(str(error).split())
    return f"{type(error).__name__}: {message}" if message else type(error).__name__


def read_records(path: Path) -> list[dict[str, Any]]:
    """Every complete record of a step's file (a line cut short by a kill is left out)."""
    if not path.is_file():
        return []
    records = []
    for line in path.read_text().splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records
