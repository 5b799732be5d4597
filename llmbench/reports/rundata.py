"""A run folder read back: results.json, requests.jsonl, steps.jsonl, sessions.jsonl,
telemetry.csv, experts.json — everything a report is drawn from (nothing else: reports rebuild
anywhere).

Every file is read through the harness module that writes it: `results` (typed, versioned:
an older schema arrives migrated, an unknown one is refused in one line), `record_log` and
`telemetry`, `experts`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmbench.errors import UserError
from llmbench.harness import expert_stats_file, record_log, results, telemetry, variant_index
from llmbench.harness.records import RequestRecord
from llmbench.harness.results import RunResult
from llmbench.harness.sweep_folders import point_folders


@dataclass(frozen=True)
class RunData:
    folder: Path
    result: RunResult
    results: dict[str, Any]  # `result` as plain JSON values, the current schema's keys
    requests: list[RequestRecord]  # measured requests only (warm-up dropped)
    steps: list[dict[str, Any]]  # roofline points: engine steps, or estimated decode windows
    sessions: list[dict[str, Any]]
    telemetry: list[dict[str, float]]
    # A mixture of experts' routing statistics (experts.json); None for a dense model.
    experts: dict[str, Any] | None = None

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


def load(folder: Path) -> RunData:
    """Read a run folder; a missing or damaged results.json is the user's to fix, in one line."""
    if not (folder / results.RESULTS_FILE).is_file():
        raise UserError(f"{folder}: no results.json here; pass a folder that `llmbench run` wrote")
    result = results.read_results(folder)
    requests = record_log.read_requests(folder)
    return RunData(
        folder=folder,
        result=result,
        results=json.loads(json.dumps(results.to_dict(result))),  # lists, as in the file
        requests=[r for r in requests if not r.is_warmup],
        steps=record_log.read_steps(folder),
        sessions=record_log.read_sessions(folder),
        telemetry=telemetry.read_csv(folder / "telemetry.csv"),
        experts=expert_stats_file.read_experts(folder),
    )


def sweep_points(folder: Path) -> list[RunData]:
    """The points of a sweep folder (`point-<value>/` subfolders), in sweep order."""
    return [load(p) for p in point_folders(folder) if (p / results.RESULTS_FILE).is_file()]


def runs_in(folder: Path) -> dict[str | None, RunData]:
    """Every run a folder holds, by its place in it: {None: run} for a run folder, {"point-4":
    run, ...} for a sweep (in sweep order), and a variants folder's variants under their folders
    ("variants/int8", or "variants/int8/point-4" for a variant that is a sweep). A variant that
    failed before writing anything has no run."""
    if not folder.is_dir():
        raise UserError(f"{folder}: no such folder; pass a folder that `llmbench run` wrote")
    if variant_index.is_variants_folder(folder):
        runs: dict[str | None, RunData] = {}
        for entry in variant_index.read_index(folder).variants:
            sub = folder / entry.folder
            # a run, or a sweep with a point done
            if any((f / results.RESULTS_FILE).is_file() for f in (sub, *point_folders(sub))):
                for where, run in runs_in(sub).items():
                    runs[entry.folder if where is None else f"{entry.folder}/{where}"] = run
        if not runs:
            raise UserError(f"{folder}: no variant here wrote results.json; nothing to read")
        return runs
    if (folder / results.RESULTS_FILE).is_file():
        return {None: load(folder)}
    points = sweep_points(folder)
    if not points:
        raise UserError(
            f"{folder}: no results.json and no sweep points here; pass a folder that "
            "`llmbench run` wrote"
        )
    return {run.folder.name: run for run in points}
