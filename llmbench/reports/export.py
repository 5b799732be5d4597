"""`llmbench export`: a run folder flattened into tables (CSV or Parquet) for notebooks.

requests: one row per request with its measured metrics; steps: one row per roofline point
(list columns summarised as counts and sums); summary: one row, nested keys joined with dots.
A sweep or a variants folder: every point's or variant's rows, led by the column `run`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from llmbench.errors import UserError
from llmbench.harness import metrics
from llmbench.reports.rundata import RunData


def request_rows(run: RunData) -> list[dict[str, Any]]:
    rows = []
    for r in run.requests:
        row = {
            k: v
            for k, v in dataclasses.asdict(r).items()
            if k not in ("chunk_ns", "chunk_tokens", "output_text", "server_timings")
        }
        row.update(
            num_output_tokens=r.num_output_tokens,
            num_chunks=len(r.chunk_ns),
            ttft_ms=metrics.ttft_ms(r),
            ttft_from_send_ms=metrics.ttft_from_send_ms(r),
            tpot_ms=metrics.tpot_ms(r),
            e2e_ms=metrics.e2e_ms(r),
            queue_ms=metrics.queue_ms(r),
            t_sent_s=(r.sent_ns - run.t0_ns) / 1e9,  # since the run's first send
            # The server's own timings as columns (None where it reported none).
            **{name: metric(r) for name, metric in metrics.SERVER_TIMINGS.items()},
        )
        rows.append(row)
    return rows


def step_rows(run: RunData) -> list[dict[str, Any]]:
    rows = []
    for step in run.steps:
        row = {k: v for k, v in step.items() if not isinstance(v, list)}
        if "context_lens" in step:
            row["sum_context_len"] = sum(step["context_lens"])
            row["max_context_len"] = max(step["context_lens"], default=0)
        seconds = (step["t_end_ns"] - step["t_start_ns"]) / 1e9
        row["t_start_s"] = (step["t_start_ns"] - run.t0_ns) / 1e9
        row["seconds"] = seconds
        if seconds > 0:
            row["bytes_per_s"] = step["bytes"] / seconds
            row["flops_per_s"] = step["flops"] / seconds
        rows.append(row)
    return rows


def flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{'a': {'b': 1}, 'c': [1, 2]} → {'a.b': 1, 'c': '[1, 2]'}."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, name + "."))
        elif isinstance(value, list):
            out[name] = str(value)
        else:
            out[name] = value
    return out


def export(runs: Mapping[str | None, RunData], out_dir: Path, fmt: str) -> list[Path]:
    """Write requests, steps and summary tables of `runs` (`rundata.runs_in`); returns the files
    written. One run's rows are as they are; a sweep's points or a variants folder's variants
    share each table, every row led by `run`, its folder within the one exported."""
    try:
        import pandas as pd
    except ImportError:
        raise UserError("export needs pandas: pip install 'llmbench[export]'") from None
    rows: dict[str, list[dict[str, Any]]] = {"requests": [], "steps": [], "summary": []}
    for where, run in runs.items():
        head = {"name": run.results.get("name")}
        if run.result.sweep_point is not None:
            head["sweep_point"] = run.result.sweep_point
        summary = [flatten({**head, **run.summary})] if run.summary else []
        for name, found in zip(rows, (request_rows(run), step_rows(run), summary), strict=True):
            rows[name] += found if where is None else [{"run": where, **row} for row in found]
    tables = {name: pd.DataFrame(found) for name, found in rows.items()}
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, frame in tables.items():
        path = out_dir / f"{name}.{fmt}"
        if fmt == "csv":
            frame.to_csv(path, index=False)
        else:
            try:
                frame.to_parquet(path, index=False)
            except ImportError:
                raise UserError(
                    "Parquet needs pyarrow: pip install 'llmbench[export]', or use --format csv"
                ) from None
        written.append(path)
    return written
