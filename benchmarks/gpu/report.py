"""The sitting's results as plain data (`summary.json`), as Markdown tables (`summary.md`) and as
the few lines printed last; rebuilt from the steps' records after every step, so a sitting cut
short still leaves the tables of what it measured.

Targets (issue 25), judged on the plan's own points:
  decode MBU at batch 1, graphs on, shortest context   >= 0.75
  paged decode attention alone, of the read roof        >= 0.80
  |decode at batch 1 / what-if − 1| (graphs on)         <= 0.15
  prefill MFU at the longest prompt                     >= 0.60
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.gpu.part_records import read_records
from benchmarks.gpu.step_process import StepOutcome

GB, TFLOP = 1e9, 1e12


def fmt(value: float | None, spec: str = ".2f", scale: float = 1.0) -> str:
    """A number for a table cell ("-" for none)."""
    return "-" if value is None else format(value / scale, spec)


def by_part(records: Sequence[dict], part: str) -> list[dict]:
    return [r["row"] for r in records if r.get("part") == part and "row" in r]


def problems(records: Sequence[dict]) -> list[str]:
    """Every part's error or skip, one line each."""
    return [
        f"{r['part']}: {'error' if 'error' in r else 'skipped'}: {r.get('error', r.get('skipped'))}"
        for r in records
        if "error" in r or "skipped" in r
    ]


def above_roof(engine: Sequence[dict]) -> list[str]:
    """A line for each decode or prefill point that ran faster than the roof it is put against:
    its MBU or MFU is left blank (`analysis.phase_utilization`), because the roof is wrong (a
    probe measured while the machine was busy, or too small to reach the peak)."""
    roofs = ((by_part(engine, "roofs") or [{}])[0].get("roofs")) or {}
    read, flops = roofs.get("read_bytes_per_s"), roofs.get("flops_per_s")
    lines = []
    for row in by_part(engine, "decode"):
        if row.get("mbu") is None and read and row["bytes_per_s"] > read:
            lines.append(
                f"decode batch {row['batch']} context {row['context']} graphs {row['graphs']}: "
                f"read {row['bytes_per_s'] / GB:.2f} GB/s, above the measured read roof "
                f"{read / GB:.2f} GB/s; MBU left blank (measure the roofs again on a quiet device)"
            )
    for row in by_part(engine, "prefill"):
        if row.get("mfu") is None and flops and row["flops_per_s"] > flops:
            lines.append(
                f"prefill of {row['num_tokens']} tokens: {row['flops_per_s'] / TFLOP:.3f} TFLOP/s, "
                f"above the measured matmul roof {flops / TFLOP:.3f} TFLOP/s; MFU left blank "
                "(measure the roofs again on a quiet device)"
            )
    return lines


def pytest_counts(xml_path: Path) -> dict[str, Any] | None:
    """Tests, failures, errors, skips and the names of failed tests of a junit xml file."""
    if not xml_path.is_file():
        return None
    try:
        root = ET.parse(xml_path).getroot()
    except ET.ParseError as error:
        return {"error": f"unreadable junit xml: {error}"}
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    counts = {key: sum(int(s.get(key, 0)) for s in suites) for key in ("tests", "failures")}
    counts |= {key: sum(int(s.get(key, 0)) for s in suites) for key in ("errors", "skipped")}
    counts["failed"] = [
        f"{case.get('classname')}::{case.get('name')}"
        for case in root.iter("testcase")
        if case.find("failure") is not None or case.find("error") is not None
    ]
    counts["passed"] = counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
    return counts


def run_summary(results_path: Path) -> dict[str, Any] | None:
    """The agentic run's headline numbers and GPU telemetry, from its results.json."""
    if not results_path.is_file():
        return None
    results = json.loads(results_path.read_text())
    summary = results.get("summary", {})
    telemetry = (results.get("telemetry") or {}).get("summary") or {}
    return {
        "num_completed": summary.get("num_completed"),
        "num_failed": summary.get("num_failed"),
        "output_tok_per_s": summary.get("output_tok_per_s"),
        "ttft_ms_p50": (summary.get("ttft_ms") or {}).get("p50"),
        "tpot_ms_p50": (summary.get("tpot_ms") or {}).get("p50"),
        "decode_mbu": summary.get("decode_mbu"),
        "prefill_mfu": summary.get("prefill_mfu"),
        "telemetry": telemetry,
        "telemetry_notes": (results.get("telemetry") or {}).get("notes", []),
        "kernels": ((results.get("provenance") or {}).get("device") or {}).get("kernels"),
    }


def targets(engine: Sequence[dict]) -> list[dict[str, Any]]:
    """The issue's four targets on this sitting's points: measured value and verdict. The
    what-if is a bound, so its ratio is given as it is: above 1, the step ran slower than it."""
    decode = by_part(engine, "decode")
    batch1 = sorted(
        (r for r in decode if r["batch"] == 1 and r["graphs"] == "on"), key=lambda r: r["context"]
    )
    first = batch1[0] if batch1 else {}
    prefill = sorted(by_part(engine, "prefill"), key=lambda r: r["num_tokens"])
    attention = by_part(engine, "attention")
    rows = [
        ("decode MBU, batch 1, graphs on, >= 0.75", first.get("mbu"), lambda v: v >= 0.75),
        (
            "attention kernel alone, of the read roof, >= 0.8",
            (attention or [{}])[0].get("roof_fraction"),
            lambda v: v >= 0.8,
        ),
        (
            "decode / what-if, batch 1, graphs on, within 0.85-1.15",
            first.get("measured_over_whatif"),
            lambda v: abs(v - 1) <= 0.15,
        ),
        (
            "prefill MFU, longest prompt, >= 0.6",
            (prefill or [{}])[-1].get("mfu"),
            lambda v: v >= 0.6,
        ),
    ]
    return [
        {
            "target": name,
            "value": value,
            "verdict": "no data" if value is None else "met" if is_met(value) else "missed",
        }
        for name, value, is_met in rows
    ]


def collect(
    work: Path, out: Path, plan_name: str, outcomes: Sequence[StepOutcome], seconds: float
) -> dict[str, Any]:
    """Everything the steps have recorded so far, as one plain-data summary."""
    engine = read_records(work / "engine.jsonl")
    roofs = read_records(work / "roofs.jsonl")
    parity = read_records(work / "parity.jsonl")
    device = by_part(read_records(work / "device.jsonl"), "device")
    return {
        "plan": plan_name,
        "seconds": seconds,
        "device": device[0] if device else None,
        "steps": [vars(o) for o in outcomes],
        "pytest": pytest_counts(out / "pytest-gpu.xml"),
        "parity": by_part(parity, "parity"),
        "ceilings": (by_part(roofs, "ceilings") or [None])[0],
        "datasheet": ((by_part(roofs, "datasheet") or [{}])[0]).get("row"),
        "fp8": (by_part(roofs, "fp8") or [None])[0],
        "engine": (by_part(engine, "engine") or [None])[0],
        "roofs_used": (by_part(engine, "roofs") or [None])[0],
        "decode": by_part(engine, "decode"),
        "attention": by_part(engine, "attention"),
        "prefill": by_part(engine, "prefill"),
        "profile": by_part(engine, "profile"),
        "run": run_summary(out / "agentic-results.json"),
        "targets": targets(engine),
        "problems": problems(parity + roofs + engine) + above_roof(engine),
    }


def steps_only(plan_name: str, outcomes: Sequence[StepOutcome], seconds: float) -> dict:
    """A summary of the steps alone (when the records cannot be read), in `collect`'s shape."""
    return {
        "plan": plan_name,
        "seconds": seconds,
        "device": None,
        "steps": [vars(o) for o in outcomes],
        **dict.fromkeys(("pytest", "ceilings", "datasheet", "fp8", "engine", "run")),
        **{key: [] for key in ("parity", "decode", "attention", "prefill", "profile")},
        "roofs_used": None,
        "targets": [],
        "problems": [],
    }


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]


def roof_rows(summary: dict) -> list[list[str]]:
    """Measured roofs beside the datasheet's: probe, measured, datasheet, measured/datasheet."""
    ceilings, sheet = summary["ceilings"] or {}, summary["datasheet"] or {}
    flops, sheet_flops = ceilings.get("matmul_flops_per_s", {}), sheet.get("flops_per_s") or {}
    bandwidth = sheet.get("memory_bandwidth_bytes_per_s")
    rows = [
        ("HBM read GB/s", ceilings.get("read_bytes_per_s"), bandwidth, GB),
        ("HBM copy GB/s", ceilings.get("copy_bytes_per_s"), bandwidth, GB),
        *((f"matmul {d} TFLOP/s", flops.get(d), sheet_flops.get(d), TFLOP) for d in flops),
        (
            "matmul fp8 TFLOP/s (sitting's probe)",
            (summary["fp8"] or {}).get("best_per_s"),
            None,
            TFLOP,
        ),
    ]
    return [
        [
            name,
            fmt(value, ".1f", scale),
            fmt(peak, ".1f", scale),
            fmt(value / peak if value and peak else None),
        ]
        for name, value, peak, scale in rows
    ]


def markdown(summary: dict) -> str:
    """summary.md: every table of the sitting."""
    device = summary["device"] or {}
    lines = [
        f"# GPU sitting ({summary['plan']})",
        "",
        f"{device.get('card', '?')}, driver {device.get('driver', '-')}, CUDA "
        f"{device.get('cuda', '-')}, torch {device.get('torch', '?')}, Triton "
        f"{device.get('triton', '-')}, transformers {device.get('transformers', '-')}; "
        f"datasheet row {device.get('datasheet') or '-'}; {summary['seconds']:.0f} s.",
        "",
        "## Steps",
        "",
        *_table(
            ["step", "status", "s", "note"],
            [
                [o["name"], o["status"], f"{o['seconds']:.0f}", o["error"] or ""]
                for o in summary["steps"]
            ],
        ),
    ]
    tests = summary["pytest"]
    if tests:
        lines += ["", "## pytest (gpu-marked and Triton kernel tests)", ""]
        if "error" in tests:
            lines.append(tests["error"])
        else:
            lines.append(
                f"{tests['passed']} passed, {tests['failures']} failed, {tests['errors']} errors, "
                f"{tests['skipped']} skipped of {tests['tests']}"
            )
            lines += [f"- failed: `{name}`" for name in tests["failed"]]
    if summary["parity"]:
        lines += ["", "## Engine vs transformers", ""]
        lines += _table(
            ["model", "dtype", "tokens agreed", "logit rel. error", "tolerance", "pass"],
            [
                [
                    r["arch"],
                    r["dtype"],
                    f"{r['num_agreed']}/{r['num_tokens']}",
                    fmt(r["logit_rel_error"], ".1e"),
                    fmt(r["tolerance"], ".0e"),
                    "yes" if r["is_pass"] else "NO",
                ]
                for r in summary["parity"]
            ],
        )
    if summary["ceilings"]:
        lines += ["", "## Roofs: measured and datasheet", ""]
        lines += _table(["probe", "measured", "datasheet", "ratio"], roof_rows(summary))
    if summary["decode"]:
        lines += ["", f"## Decode ({summary['engine'] and summary['engine']['model']})", ""]
        lines += _table(
            [
                "batch",
                "context",
                "graphs",
                "tok/s",
                "TPOT ms",
                "GB/s",
                "MBU",
                "what-if ms",
                "measured/what-if",
                "datasheet what-if ms",
            ],
            [
                [
                    str(r["batch"]),
                    str(r["context_mean"]),
                    r["graphs"]
                    + ("" if r["is_graphed"] or r["graphs"] == "off" else " (not graphed)"),
                    fmt(r["tok_per_s"], ".0f"),
                    fmt(r["tpot_ms"], ".3f"),
                    fmt(r["bytes_per_s"], ".0f", GB),
                    fmt(r["mbu"]),
                    fmt(r["whatif_ms"], ".3f"),
                    fmt(r["measured_over_whatif"]),
                    fmt(r["datasheet_whatif_ms"], ".3f"),
                ]
                for r in summary["decode"]
            ],
        )
    if summary["attention"]:
        lines += ["", "## Paged decode attention kernel alone", ""]
        lines += _table(
            ["batch", "context", "dtype", "ms", "GB/s", "of read roof"],
            [
                [
                    str(r["batch"]),
                    str(r["context"]),
                    r["dtype"],
                    fmt(r["ms_best"], ".3f"),
                    fmt(r["bytes_per_s"], ".0f", GB),
                    fmt(r["roof_fraction"]),
                ]
                for r in summary["attention"]
            ],
        )
    if summary["prefill"]:
        lines += ["", "## Prefill", ""]
        lines += _table(
            [
                "tokens",
                "ms (median)",
                "TFLOP/s",
                "MFU",
                "MFU (best)",
                "what-if ms",
                "measured/what-if",
            ],
            [
                [
                    str(r["num_tokens"]),
                    fmt(r["step_ms"], ".2f"),
                    fmt(r["flops_per_s"], ".1f", TFLOP),
                    fmt(r["mfu"]),
                    fmt(r["mfu_best"]),
                    fmt(r["whatif_ms"], ".2f"),
                    fmt(r["measured_over_whatif"]),
                ]
                for r in summary["prefill"]
            ],
        )
    for row in summary["profile"]:
        lines += [
            "",
            f"## Profile: eager decode step, batch {row['batch']}, context {row['context_mean']}",
            "",
            f"wall {row['wall_ms']:.3f} ms a step, busy {row['busy_ms']:.3f} ms "
            f"({fmt(row['busy_fraction'])}) ({row['activities']})",
            "",
        ]
        lines += _table(
            ["kernel / op", "calls", "ms", "share"],
            [
                [
                    t["name"].replace("|", "/"),
                    fmt(t["calls_per_step"], ".0f"),
                    fmt(t["ms_per_step"], ".3f"),
                    fmt(t["share"]),
                ]
                for t in row["top"]
            ],
        )
    run = summary["run"]
    if run:
        telemetry = run["telemetry"]
        lines += ["", "## `llmbench run workloads/agentic.yaml` (short)", ""]
        lines += _table(
            [
                "requests",
                "failed",
                "output tok/s",
                "TTFT p50 ms",
                "TPOT p50 ms",
                "decode MBU",
                "prefill MFU",
                "power W mean/max",
                "SM MHz mean",
                "GPU memory GB max",
            ],
            [
                [
                    str(run["num_completed"]),
                    str(run["num_failed"]),
                    fmt(run["output_tok_per_s"], ".0f"),
                    fmt(run["ttft_ms_p50"], ".1f"),
                    fmt(run["tpot_ms_p50"], ".2f"),
                    fmt(run["decode_mbu"]),
                    fmt(run["prefill_mfu"]),
                    f"{fmt(_stat(telemetry, 'power_w', 'mean'), '.0f')}/"
                    f"{fmt(_stat(telemetry, 'power_w', 'max'), '.0f')}",
                    fmt(_stat(telemetry, "sm_clock_mhz", "mean"), ".0f"),
                    fmt(_stat(telemetry, "gpu_memory_used_bytes", "max"), ".1f", GB),
                ]
            ],
        )
        lines += [f"- telemetry: {note}" for note in run["telemetry_notes"]]
    lines += ["", "## Targets", ""]
    lines += _table(
        ["target", "value", "verdict"],
        [[t["target"], fmt(t["value"]), t["verdict"]] for t in summary["targets"]],
    )
    if summary["problems"]:
        lines += ["", "## Errors and skips within steps", ""]
        lines += [f"- {line}" for line in summary["problems"]]
    return "\n".join(lines) + "\n"


def _stat(telemetry: dict, column: str, stat: str) -> float | None:
    return (telemetry.get(column) or {}).get(stat)


def short_lines(summary: dict, files: Sequence[Path]) -> list[str]:
    """The summary printed last: one line per step, the targets, the files."""
    device = summary["device"] or {}
    steps = summary["steps"]
    bad = [s["name"] for s in steps if s["status"] != "ok"]
    lines = [
        f"GPU sitting ({summary['plan']}) on {device.get('card', '?')}: {len(steps)} steps, "
        f"{len(steps) - len(bad)} ok{', not ok: ' + ', '.join(bad) if bad else ''}; "
        f"{summary['seconds']:.0f} s"
    ]
    for step in steps:
        note = f" - {step['error']}" if step["error"] else ""
        lines.append(f"  {step['name']:<7} {step['status']:<8} {step['seconds']:>5.0f} s{note}")
    for target in summary["targets"]:
        lines.append(f"  target {target['target']}: {fmt(target['value'])} {target['verdict']}")
    lines.append(f"  {len(files)} files: {', '.join(p.name for p in files)}")
    return lines
