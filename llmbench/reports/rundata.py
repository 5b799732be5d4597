"""A run folder read back: results.json, requests.jsonl, steps.jsonl, sessions.jsonl,
telemetry.csv — everything a report is drawn from (nothing else: reports rebuild anywhere)."""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from llmbench.errors import UserError
from llmbench.harness.records import RequestRecord


@dataclass(frozen=True)
class RunData:
    folder: Path
    results: dict[str, Any]
    requests: list[RequestRecord]  # measured requests only (warm-up dropped)
    steps: list[dict[str, Any]]  # roofline points: engine steps, or estimated decode windows
    sessions: list[dict[str, Any]]
    telemetry: list[dict[str, float]]

    @property
    def summary(self) -> dict[str, Any]:
        return self.results["summary"]

    @property
    def provenance(self) -> dict[str, Any]:
        return self.results["provenance"]

    @property
    def t0_ns(self) -> int:
        """The run's time origin: the first measured send (or the first step, without one)."""
        starts = [r.sent_ns for r in self.requests] or [s["t_start_ns"] for s in self.steps]
        return min(starts, default=0)


def _jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    rows = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as e:
            raise UserError(f"{path}:{number}: not valid JSON ({e.msg})") from None
    return rows


def _telemetry(path: Path) -> list[dict[str, float]]:
    if not path.is_file():
        return []
    with path.open(newline="") as f:
        return [
            {key: float(value) for key, value in row.items() if value not in ("", None)}
            for row in csv.DictReader(f)
        ]


_RECORD_FIELDS = {f.name for f in fields(RequestRecord)}


def load(folder: Path) -> RunData:
    """Read a run folder; a missing or damaged results.json is the user's to fix, in one line."""
    path = folder / "results.json"
    if not path.is_file():
        raise UserError(f"{folder}: no results.json here; pass a folder that `llmbench run` wrote")
    try:
        results = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise UserError(f"{path}: not valid JSON ({e.msg} at line {e.lineno})") from None
    if "summary" not in results or "provenance" not in results:
        raise UserError(f"{path}: not an llmbench results file (no summary/provenance)")
    requests = [
        RequestRecord(**{k: v for k, v in row.items() if k in _RECORD_FIELDS})
        for row in _jsonl(folder / "requests.jsonl")
    ]
    return RunData(
        folder=folder,
        results=results,
        requests=[r for r in requests if not r.is_warmup],
        steps=_jsonl(folder / "steps.jsonl"),
        sessions=_jsonl(folder / "sessions.jsonl"),
        telemetry=_telemetry(folder / "telemetry.csv"),
    )


def sweep_points(folder: Path) -> list[RunData]:
    """The points of a sweep folder (`point-<value>/` subfolders), in sweep order."""
    subfolders = [p for p in folder.glob("point-*") if (p / "results.json").is_file()]
    runs = [load(p) for p in subfolders]
    return sorted(runs, key=lambda run: run.results.get("sweep_point") or 0)
