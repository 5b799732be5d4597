"""The numbers both reports show, as rows of formatted cells: one source for HTML and Markdown."""

from __future__ import annotations

import math
from typing import Any

from llmbench.harness import metrics
from llmbench.harness.spread import metric_value
from llmbench.reports.rundata import RunData

LATENCIES = ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms", "queue_ms")
QUANTILES = ("mean", "p50", "p90", "p95", "p99", "max")


def si(value: float, unit: str = "") -> str:
    """1234 → '1.23k', 2.5e12 → '2.5T' (three significant digits), with an optional unit."""
    if value == 0 or not math.isfinite(value):
        return f"{value:g}{unit}"
    for factor, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= factor:
            return f"{value / factor:.3g}{prefix}{unit}"
    if abs(value) >= 1e-3 or unit == "":
        return f"{value:.3g}{unit}"
    return f"{value:.2e}{unit}"


def num(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def headline(run: RunData) -> list[tuple[str, str]]:
    """(label, value) of the summary cards."""
    s = run.summary
    cards = [
        ("requests", f"{s['num_completed']} ok, {s['num_failed']} failed"),
        ("duration", f"{num(s['duration_s'])} s"),
        ("output tokens/s", num(s["output_tok_per_s"])),
        ("requests/s", num(s["request_per_s"], 2)),
        ("TTFT p50 / p99", f"{num(s['ttft_ms']['p50'])} / {num(s['ttft_ms']['p99'])} ms"),
        ("TPOT p50 / p99", f"{num(s['tpot_ms']['p50'])} / {num(s['tpot_ms']['p99'])} ms"),
        ("ITL p99", f"{num(s['itl_ms']['p99'])} ms"),
    ]
    if run.results.get("spec", {}).get("slo"):
        cards.append(
            (
                "goodput",
                f"{num(s['goodput_request_per_s'], 2)} req/s "
                f"({ratio(s['goodput_fraction'])} of requests)",
            )
        )
    estimated = " (est.)" if s.get("roofline_is_estimated") else ""
    if "decode_mbu" in s:
        cards.append(("decode MBU" + estimated, ratio(s["decode_mbu"])))
    if "prefill_mfu" in s:
        cards.append(("prefill MFU" + estimated, ratio(s["prefill_mfu"])))
    cards.append(("prefix-cache hit rate", ratio(s.get("prefix_cache_hit_rate"))))
    return cards


def warnings(run: RunData) -> list[str]:
    """What makes the numbers less than clean, in words."""
    out = []
    s, p = run.summary, run.provenance
    if run.results.get("interrupted"):
        out.append("The run was interrupted: these are partial results.")
    if s.get("machine_busy"):
        load = p.get("machine_load", {})
        out.append(
            f"The machine was busy: other processes used {load.get('other_processes_cores')} "
            f"cores during the run (of {load.get('cpu_count')}); the numbers are pessimistic."
        )
    if s["num_failed"]:
        out.append(f"{s['num_failed']} requests failed; latencies are over completed ones.")
    if s.get("roofline_is_estimated"):
        out.append(
            "The roofline is estimated from the client (a remote server's steps are not "
            "visible): a step per inter-token gap, batch = streams decoding."
        )
    if s.get("token_count_mismatches"):
        out.append(
            f"{s['token_count_mismatches']} requests: the server counted a different number of "
            "prompt tokens than the client tokenizer."
        )
    return out


def latency_rows(run: RunData) -> list[list[str]]:
    rows = []
    for name in LATENCIES:
        d = run.summary[name]
        rows.append([name, *(num(d[q]) for q in QUANTILES), str(d.get("count", "-"))])
    return rows


PHASE_HEADER = ("phase", "steps", "seconds", "bandwidth", "compute", "FLOP/B", "MBU", "MFU")


def phase_rows(run: RunData) -> list[list[str]]:
    """Per-phase roofline numbers: steps, time, achieved bandwidth and FLOP/s, MBU, MFU."""
    roof = run.results.get("roofline") or {}
    rows = []
    for phase in ("decode", "prefill", "mixed"):
        d = roof.get("phases", {}).get(phase)
        if d is None:
            continue
        rows.append(
            [
                phase,
                num(d["num_steps"], 0),
                num(d["seconds"], 2),
                si(d["bytes_per_s"], "B/s"),
                si(d["flops_per_s"], "FLOP/s"),
                "-" if d["arithmetic_intensity"] is None else f"{d['arithmetic_intensity']:.3g}",
                ratio(d["mbu"]),
                ratio(d["mfu"]),
            ]
        )
    return rows


def roofs(run: RunData) -> list[tuple[str, str]]:
    """The roofs the run is placed under, with where they come from."""
    roof = run.results.get("roofline") or {}
    out = []
    dtype = roof.get("dtype", "")
    for r in (roof.get("roofs"), roof.get("datasheet_roofs")):
        if not r:
            continue
        flops = si(r["flops_per_s"], "FLOP/s") if r["flops_per_s"] else "(not measured)"
        out.append((r["label"], f"{si(r['read_bytes_per_s'], 'B/s')} read, {flops} {dtype} matmul"))
    return out


SLO_HEADER = ("SLO", "limit", "met", "share")


def slo_rows(run: RunData) -> list[list[str]]:
    """Each SLO alone: its limit and the share of measured requests that met it."""
    slo = run.results.get("spec", {}).get("slo") or {}
    rows = []
    for name, limit in slo.items():
        met = sum(metrics.is_slo_met(r, {name: limit}) for r in run.requests)
        share = met / len(run.requests) if run.requests else None
        rows.append([name, f"<= {limit:g} ms", f"{met} / {len(run.requests)}", ratio(share)])
    return rows


def session_rows(run: RunData) -> list[tuple[str, str]]:
    s = run.summary.get("sessions") or {}
    if not s.get("num_sessions"):
        return []
    return [
        ("sessions", f"{s['num_sessions']} ({s['num_failed_sessions']} with a failed request)"),
        ("mean session time", f"{num(s['mean_session_s'], 2)} s"),
        ("waiting on the model", f"{num(s['mean_model_wait_s'], 2)} s per session"),
        ("waiting on tools / the user", f"{num(s['mean_tool_wait_s'], 2)} s per session"),
        ("requests per session", num(s["mean_requests_per_session"], 1)),
        ("prefix-cache hit rate", ratio(s.get("prefix_cache_hit_rate"))),
    ]


def provenance_rows(run: RunData) -> list[tuple[str, str]]:
    p = run.provenance
    device = p.get("device", {})
    versions = ", ".join(f"{k} {v}" for k, v in p.get("versions", {}).items() if v)
    rows: list[tuple[str, Any]] = [
        ("model", f"{p.get('model')} ({p.get('dtype')})"),
        ("backend", p.get("backend")),
        ("device", ", ".join(f"{k}: {v}" for k, v in device.items())),
        ("git sha", p.get("git_sha") or "-"),
        ("versions", versions),
        ("spec hash / workload hash", f"{p.get('spec_hash')} / {p.get('workload_hash')}"),
        ("seed", p.get("seed")),
        ("host", f"{p.get('host')} ({p.get('platform')})"),
    ]
    hw = p.get("hardware")
    if hw:
        flops = ", ".join(f"{k} {si(v, 'FLOP/s')}" for k, v in hw["matmul_flops_per_s"].items())
        rows.append(
            (
                "measured ceilings",
                f"{hw['device']}, {hw['threads']} threads: copy "
                f"{si(hw['copy_bytes_per_s'], 'B/s')}, read "
                f"{si(hw['read_bytes_per_s'], 'B/s')}; matmul {flops}",
            )
        )
    load = p.get("machine_load")
    if load:
        rows.append(("machine load", ", ".join(f"{k} {v}" for k, v in load.items())))
    telemetry = run.results.get("telemetry") or {}
    if telemetry.get("notes"):
        rows.append(("telemetry", "; ".join(telemetry["notes"])))
    return [(k, str(v)) for k, v in rows]


# The repetitions table: (column, spread metric or None, how a value is shown).
_REPETITION_COLUMNS = (
    ("output tok/s", "output_tok_per_s", num),
    ("TTFT p50 (ms)", "ttft_ms.p50", num),
    ("TPOT p50 (ms)", "tpot_ms.p50", num),
    ("TPOT p99 (ms)", "tpot_ms.p99", num),
    ("decode MBU", "decode_mbu", ratio),
    ("prefill MFU", "prefill_mfu", ratio),
    ("prefix-cache hit rate", "prefix_cache_hit_rate", ratio),
)
REPETITION_HEADER = ("repetition", "requests", *(c[0] for c in _REPETITION_COLUMNS))
REPETITION_NOTE = (
    "The numbers above pool every repetition; each row here is one repetition alone. mean and "
    "cv (stdev / mean, stdev with n - 1) are over the whole repetitions: how much the same "
    "workload moves from one measurement to the next."
)


def percent(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def repetition_rows(run: RunData) -> list[list[str]]:
    """A row per repetition (its own summary), then the mean and the coefficient of variation
    between the whole repetitions (`summary.spread`); no rows for a run of one repetition."""
    s = run.summary
    repetitions = s.get("repetitions") or []
    if len(repetitions) < 2:
        return []
    rows = [
        [
            f"{r['repetition']}{' (partial)' if r['is_partial'] else ''}",
            str(r["num_completed"]),
            *(show(metric_value(r, name)) for _, name, show in _REPETITION_COLUMNS),
        ]
        for r in repetitions
    ]
    spread = s.get("spread") or {}
    for statistic, show_all in (("mean", None), ("cv", percent)):
        rows.append(
            [
                statistic,
                "",
                *(
                    (show_all or show)((spread.get(name) or {}).get(statistic))
                    for _, name, show in _REPETITION_COLUMNS
                ),
            ]
        )
    return rows


SWEEP_HEADER = (
    "point",
    "output tok/s",
    "TTFT p50",
    "TTFT p99",
    "TPOT p50",
    "TPOT p99",
    "decode MBU",
)


def sweep_rows(points: list[RunData]) -> list[list[str]]:
    """A row per sweep point: its load value, throughput, latency percentiles, decode MBU."""
    return [
        [
            f"{run.results.get('sweep_point'):g}",
            num(run.summary["output_tok_per_s"]),
            num(run.summary["ttft_ms"]["p50"]),
            num(run.summary["ttft_ms"]["p99"]),
            num(run.summary["tpot_ms"]["p50"]),
            num(run.summary["tpot_ms"]["p99"]),
            ratio(run.summary.get("decode_mbu")),
        ]
        for run in points
    ]
