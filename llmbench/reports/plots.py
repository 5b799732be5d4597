"""Every figure of a report, drawn from a `RunData` as inline SVG (None when there is no data).

roofline · TTFT and TPOT CDFs · ITL histogram · timeline · session waterfall · sweep curves.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from llmbench.harness import metrics
from llmbench.reports.rundata import RunData
from llmbench.reports.svg import BLUE, GREEN, GREY, ORANGE, PURPLE, RED, Chart, Scale, si

PHASE_COLOURS = {"decode": BLUE, "prefill": ORANGE, "mixed": GREEN}
MAX_POINTS = 4000  # roofline points drawn; a longer run is thinned evenly (the table has all)


@dataclass(frozen=True)
class Figure:
    key: str  # stable id, used as the HTML element id
    svg: str  # carries its own <title>
    caption: str


def draw_roof(
    chart: Chart,
    label: str,
    bytes_per_s: float,
    flops_per_s: float,
    colour: str = "#222",
    dash: str | None = None,
    mark_ridge: bool = True,
) -> None:
    """The roofline min(AI · bandwidth, peak FLOP/s) across the chart's x range, labelled with
    its peaks, and (`mark_ridge`) a dotted line at the ridge point AI = FLOP/s ÷ bandwidth."""
    ridge = flops_per_s / bytes_per_s
    xs = [chart.x.lo, ridge, chart.x.hi]
    chart.line(
        xs,
        [min(x * bytes_per_s, flops_per_s) for x in xs],
        colour,
        f"{label}: {si(bytes_per_s, 'B/s')}, {si(flops_per_s, 'FLOP/s')}",
        dash,
    )
    if mark_ridge:
        chart.line([ridge, ridge], [chart.y.lo, flops_per_s], GREY, dash="2 3", width=1)
        chart.label(ridge, flops_per_s, f"ridge {ridge:.3g} FLOP/B")


def roofline(run: RunData) -> Figure | None:
    """Log-log roofline: measured roofs (solid), datasheet roofs (dashed), every step a point
    coloured by phase and sized by its batch."""
    roof = run.results.get("roofline")
    points = [s for s in run.steps if s["t_end_ns"] > s["t_start_ns"] and s["bytes"] > 0]
    if roof is None or not points:
        return None
    stride = max(1, math.ceil(len(points) / MAX_POINTS))
    points = points[::stride]
    intensity = [p["flops"] / p["bytes"] for p in points]
    achieved = [p["flops"] / ((p["t_end_ns"] - p["t_start_ns"]) / 1e9) for p in points]
    roofs = [r for r in (roof.get("roofs"), roof.get("datasheet_roofs")) if r]
    ridges = [r["flops_per_s"] / r["read_bytes_per_s"] for r in roofs]
    peaks = [r["flops_per_s"] for r in roofs]
    chart = Chart(
        "Roofline" + (" (estimated from the client)" if roof.get("is_estimated") else ""),
        "arithmetic intensity (FLOP/byte)",
        "achieved FLOP/s",
        Scale.fit([*intensity, *ridges, *(x * 4 for x in ridges)], is_log=True),
        Scale.fit([*achieved, *peaks], is_log=True),
        width=760,
        height=440,
        legend_at_bottom=True,
    )
    if roof.get("roofs"):
        r = roof["roofs"]
        draw_roof(chart, r["label"], r["read_bytes_per_s"], r["flops_per_s"])
    if roof.get("datasheet_roofs"):
        r = roof["datasheet_roofs"]
        draw_roof(
            chart, r["label"], r["read_bytes_per_s"], r["flops_per_s"], RED, "6 4", mark_ridge=False
        )
    for phase, colour in PHASE_COLOURS.items():
        chosen = [i for i, p in enumerate(points) if p["phase"] == phase]
        if chosen:
            chart.points(
                [intensity[i] for i in chosen],
                [achieved[i] for i in chosen],
                colour,
                f"{phase} steps ({sum(1 for p in run.steps if p['phase'] == phase)})",
                radii=[2 + 1.2 * math.sqrt(points[i].get("num_seqs", 1)) for i in chosen],
            )
    caption = (
        "Each point is one engine step: x = FLOPs / bytes the cost model says it computed and "
        "moved, y = FLOPs / its measured time; size grows with the sequences in the step. "
        "A point on the slanted roof is bandwidth-bound at the measured peak."
    )
    if roof.get("is_estimated"):
        caption = (
            "ESTIMATED from the client: each point is a time window, step = inter-token gap, "
            "batch = streams decoding, context from the requests. " + roof.get("method", "")
        )
    if stride > 1:
        caption += f" Every {stride}th step of {len(run.steps)} is drawn."
    return Figure("roofline", chart.svg(), caption)


def _cdf(values: Sequence[float]) -> tuple[list[float], list[float]]:
    xs = sorted(values)
    return xs, [(i + 1) / len(xs) for i in range(len(xs))]


def latency_cdf(run: RunData, name: str) -> Figure | None:
    """Empirical CDF of one per-request latency: `ttft_ms` or `tpot_ms`."""
    fn = {"ttft_ms": metrics.ttft_ms, "tpot_ms": metrics.tpot_ms}[name]
    values = [v for v in (fn(r) for r in run.requests) if v is not None]
    if not values:
        return None
    slo = run.results.get("spec", {}).get("slo", {}).get(name)
    slo_in_view = slo is not None and slo <= 2 * max(values)  # else it squashes the curve
    chart = Chart(
        f"{name.removesuffix('_ms').upper()} CDF",
        f"{name} (ms)",
        "fraction of requests",
        Scale.fit([*values, *([slo] if slo_in_view else [])]),
        Scale(0.0, 1.0),
        width=470,
        height=300,
        legend_at_bottom=True,
    )
    xs, ys = _cdf(values)
    chart.line([0.0, *xs], [0.0, *ys], BLUE, f"{len(values)} requests", step=True)
    if slo_in_view:
        chart.line([slo, slo], [0.0, 1.0], RED, f"SLO {slo:g} ms", dash="4 3")
    p50, p99 = metrics.percentile(values, 50), metrics.percentile(values, 99)
    caption = f"p50 {p50:.1f} ms, p99 {p99:.1f} ms, max {max(values):.1f} ms."
    if slo is not None and not slo_in_view:
        caption += f" The SLO ({slo:g} ms) is off the chart, far right of every request."
    return Figure(name.removesuffix("_ms") + "-cdf", chart.svg(), caption)


def itl_histogram(run: RunData) -> Figure | None:
    """Inter-token latencies, one sample per token (a chunk of k tokens gives k samples)."""
    samples = [s for r in run.requests for s in metrics.itl_samples_ms(r)]
    if not samples:
        return None
    top = metrics.percentile(samples, 99.5) or max(samples) or 1.0  # all-zero gaps: any width
    num_bins = 40
    edges = [top * i / num_bins for i in range(num_bins + 1)]
    counts = [0] * num_bins
    overflow = 0
    for s in samples:
        if s > top:
            overflow += 1
        else:
            counts[min(int(s / top * num_bins), num_bins - 1)] += 1
    chart = Chart(
        "ITL histogram",
        "inter-token latency (ms)",
        "tokens",
        Scale(0.0, top),
        Scale.fit(counts),
        width=470,
        height=300,
    )
    chart.bars(edges, counts, BLUE, f"{len(samples)} token gaps")
    caption = (
        f"p50 {metrics.percentile(samples, 50):.1f} ms, p99 {metrics.percentile(samples, 99):.1f}"
        f" ms; {overflow} samples beyond {top:.1f} ms (p99.5) are not drawn."
    )
    return Figure("itl-histogram", chart.svg(), caption)


def _buckets(span_s: float) -> float:
    """A bucket width that gives about 60 buckets, rounded to a readable size."""
    raw = max(span_s / 60, 0.05)
    return next((w for w in (0.1, 0.2, 0.5, 1, 2, 5, 10, 30, 60) if w >= raw), 60.0)


def _bucket(t_ns: int, t0: int, width_s: float, num: int) -> int:
    """The timeline bucket of a time: the first or last for times outside the run."""
    return min(max(int((t_ns - t0) / 1e9 / width_s), 0), num - 1)


def timeline(run: RunData) -> list[Figure]:
    """Panels over the run's time: tokens/s, sequences, KV blocks, prefix hits, telemetry."""
    t0 = run.t0_ns
    chunks = [(t, k) for r in run.requests for t, k in zip(r.chunk_ns, r.chunk_tokens, strict=True)]
    ends = [r.end_ns for r in run.requests if r.end_ns] + [s["t_end_ns"] for s in run.steps]
    if not chunks and not run.steps:
        return []
    span_s = max((max(ends, default=t0) - t0) / 1e9, 1e-3)
    width_s = _buckets(span_s)
    num = int(span_s / width_s) + 1
    centres = [(i + 0.5) * width_s for i in range(num)]
    x = Scale(0.0, num * width_s)
    figures = []

    # Tokens/s: output tokens by arrival; prefill tokens by engine step.
    out = [0.0] * num
    for t, k in chunks:
        out[_bucket(t, t0, width_s, num)] += k / width_s
    prefill = [0.0] * num
    for s in run.steps:
        if s.get("num_prefill_tokens"):
            i = _bucket(s["t_end_ns"], t0, width_s, num)
            prefill[i] += s["num_prefill_tokens"] / width_s
    chart = Chart(
        "Throughput", "time (s)", "tokens/s", x, Scale.fit(out + prefill), width=760, height=240
    )
    chart.line(centres, out, BLUE, "output tokens/s", step=True)
    if any(prefill):
        chart.line(centres, prefill, ORANGE, "prefill tokens/s (engine)", step=True)
    figures.append(
        Figure(
            "timeline-tokens",
            chart.svg(),
            f"In {width_s:g} s buckets from the first measured send.",
        )
    )

    # Sequences: running and waiting per engine step; requests in flight from the client.
    in_flight = _in_flight(run, t0, centres)
    engine_steps = [s for s in run.steps if "context_lens" in s]
    step_ts = [(s["t_end_ns"] - t0) / 1e9 for s in engine_steps]
    running = [len(s["context_lens"]) for s in engine_steps]
    waiting = [s.get("num_waiting", 0) for s in engine_steps]
    chart = Chart(
        "Sequences",
        "time (s)",
        "sequences",
        x,
        Scale.fit(in_flight + running + waiting),
        width=760,
        height=240,
    )
    chart.line(centres, in_flight, PURPLE, "requests in flight (client)", step=True)
    if engine_steps:
        chart.line(step_ts, running, BLUE, "running (engine)", step=True, width=1.2)
        chart.line(step_ts, waiting, ORANGE, "waiting (engine)", step=True, width=1.2)
    figures.append(
        Figure(
            "timeline-sequences",
            chart.svg(),
            "Sequences the engine ran and kept waiting in each step; requests the client had open.",
        )
    )

    if engine_steps and engine_steps[0].get("num_blocks_total"):
        used = [100 * s["num_blocks_used"] / s["num_blocks_total"] for s in engine_steps]
        chart = Chart(
            "KV cache", "time (s)", "blocks in use (%)", x, Scale(0.0, 100.0), width=760, height=200
        )
        chart.line(
            step_ts, used, GREEN, f"of {engine_steps[0]['num_blocks_total']} blocks", step=True
        )
        preempted = [
            (t, s["num_preempted"])
            for t, s in zip(step_ts, engine_steps, strict=True)
            if s.get("num_preempted")
        ]
        if preempted:
            chart.points(
                [t for t, _ in preempted],
                [100.0 * 0.97] * len(preempted),
                RED,
                f"preemptions ({sum(n for _, n in preempted)})",
            )
        figures.append(
            Figure(
                "timeline-kv",
                chart.svg(),
                "KV blocks held by sequences and the prefix cache's live blocks.",
            )
        )

    utilization = _utilization(run, t0, width_s, num)
    if utilization is not None:
        chart = Chart(
            "Utilisation over time",
            "time (s)",
            "share of the measured roof",
            x,
            Scale.fit([v for series in utilization.values() for v in series if v is not None]),
            width=760,
            height=220,
        )
        for (label, series), colour in zip(utilization.items(), (BLUE, ORANGE), strict=False):
            chart.points(centres, series, colour, label)  # buckets without steps: None, skipped
        figures.append(
            Figure(
                "timeline-utilisation",
                chart.svg(),
                "Per bucket: Σ bytes / Σ time of its decode-only steps over the read roof (MBU), "
                "and Σ FLOPs / Σ time of its steps with prompt tokens over the matmul roof (MFU).",
            )
        )

    hits = _prefix_hits(run, t0, width_s, num)
    if hits is not None:
        chart = Chart(
            "Prefix-cache hits",
            "time (s)",
            "cached / prompt tokens",
            x,
            Scale(0.0, 1.0),
            width=760,
            height=200,
        )
        chart.points(centres, hits, GREEN, "hit rate of requests sent")  # None: nothing sent
        figures.append(
            Figure(
                "timeline-prefix",
                chart.svg(),
                "Prompt tokens served from the prefix cache, by send time.",
            )
        )

    if run.telemetry:
        figures.append(_telemetry(run, t0, x))
    return figures


def _in_flight(run: RunData, t0: int, centres: list[float]) -> list[float]:
    spans = [((r.sent_ns - t0) / 1e9, (r.end_ns - t0) / 1e9) for r in run.requests if r.end_ns]
    return [float(sum(1 for a, b in spans if a <= c < b)) for c in centres]


def _utilization(
    run: RunData, t0: int, width_s: float, num: int
) -> dict[str, list[float | None]] | None:
    """Decode MBU and prefill (+ mixed) MFU per time bucket; None without roofs or steps."""
    roofs = (run.results.get("roofline") or {}).get("roofs")
    if not roofs or not run.steps:
        return None
    # Per bucket: [decode bytes, decode seconds, prompt-step FLOPs, prompt-step seconds]
    sums = [[0.0, 0.0, 0.0, 0.0] for _ in range(num)]
    for step in run.steps:
        i = _bucket(step["t_end_ns"], t0, width_s, num)
        seconds = (step["t_end_ns"] - step["t_start_ns"]) / 1e9
        if step["phase"] == "decode":
            sums[i][0] += step["bytes"]
            sums[i][1] += seconds
        else:
            sums[i][2] += step["flops"]
            sums[i][3] += seconds
    return {
        "decode MBU": [b / t / roofs["read_bytes_per_s"] if t > 0 else None for b, t, _, _ in sums],
        "prefill and mixed MFU": [
            f / t / roofs["flops_per_s"] if t > 0 else None for _, _, f, t in sums
        ],
    }


def _prefix_hits(run: RunData, t0: int, width_s: float, num: int) -> list[float | None] | None:
    if not any(r.cached_tokens for r in run.requests):
        return None
    prompt, cached = [0] * num, [0] * num
    for r in run.requests:
        if r.cached_tokens is None:
            continue
        i = _bucket(r.sent_ns, t0, width_s, num)
        prompt[i] += r.server_prompt_tokens or r.num_prompt_tokens
        cached[i] += r.cached_tokens
    return [c / p if p else None for c, p in zip(cached, prompt, strict=True)]


_TELEMETRY_SERIES = (
    ("process_cpu_percent", "process CPU %", BLUE),
    ("system_cpu_percent", "all cores CPU %", GREY),
    ("gpu_util_percent", "GPU util %", GREEN),
    ("mem_util_percent", "GPU memory-bus util %", ORANGE),
)


def _telemetry(run: RunData, t0: int, x: Scale) -> Figure:
    rows = run.telemetry
    ts = [(row["t_ns"] - t0) / 1e9 for row in rows]
    present = [(key, label, c) for key, label, c in _TELEMETRY_SERIES if key in rows[0]]
    values = [row.get(key, 0.0) for row in rows for key, _, _ in present]
    chart = Chart("Telemetry", "time (s)", "percent", x, Scale.fit(values), width=760, height=220)
    for key, label, colour in present:
        chart.line(ts, [row.get(key, math.nan) for row in rows], colour, label, width=1.2)
    extra = []
    if "rss_bytes" in rows[0]:
        extra.append(f"RSS max {si(max(row['rss_bytes'] for row in rows), 'B')}")
    if "power_w" in rows[0]:
        extra.append(f"power max {max(row['power_w'] for row in rows):.0f} W")
    caption = f"Sampled every ~{_median_gap_s(ts) * 1e3:.0f} ms. " + "; ".join(extra)
    return Figure("timeline-telemetry", chart.svg(), caption)


def _median_gap_s(ts: list[float]) -> float:
    gaps = sorted(b - a for a, b in zip(ts, ts[1:], strict=False))
    return gaps[len(gaps) // 2] if gaps else 0.0


def session_waterfall(run: RunData, max_sessions: int = 40) -> Figure | None:
    """One row per session: each request's wait for the first token, then its decode, and the
    tool / think time between them as the gaps."""
    by_session: dict[str, list] = {}
    for r in run.requests:
        by_session.setdefault(r.session_id, []).append(r)
    if not by_session or all(len(rs) < 2 for rs in by_session.values()):
        return None
    t0 = run.t0_ns
    ids = sorted(by_session, key=lambda s: min(r.sent_ns for r in by_session[s]))[:max_sessions]
    end_s = max((r.end_ns - t0) / 1e9 for s in ids for r in by_session[s] if r.end_ns)
    row_px = 14
    legend_rows = 4
    chart = Chart(
        "Sessions",
        "time (s)",
        "session",
        Scale(0.0, end_s * 1.02),
        Scale(-0.5 - legend_rows, len(ids) - 0.5),  # empty rows at the bottom: the legend
        width=760,
        height=110 + row_px * (len(ids) + legend_rows),
        legend_at_bottom=True,
        y_tick_labels={float(len(ids) - 1 - row): s for row, s in enumerate(ids)},
    )
    for row, session in enumerate(ids):
        y = len(ids) - 1 - row  # first session on top
        for r in by_session[session]:
            sent, end = (r.sent_ns - t0) / 1e9, (r.end_ns - t0) / 1e9
            first = (r.chunk_ns[0] - t0) / 1e9 if r.chunk_ns else end
            chart.span(sent, first, y, row_px * 0.7, ORANGE)
            if r.end_ns:
                chart.span(first, end, y, row_px * 0.7, BLUE if r.ok else RED)
    chart.legend_entry("sent → first token", ORANGE)
    chart.legend_entry("first token → end", BLUE)
    if any(not r.ok for r in run.requests):
        chart.legend_entry("failed request", RED)
    shown = f"the first {len(ids)} of {len(by_session)}" if len(by_session) > len(ids) else "all"
    caption = (
        f"Sessions in order of their start ({shown}); the gaps between a session's "
        "requests are tool latency or think time."
    )
    return Figure("sessions", chart.svg(), caption)


def sweep_curves(points: list[RunData]) -> list[Figure]:
    """Latency against throughput, one marker per sweep point, labelled with its load."""
    if len(points) < 2:
        return []
    throughput = [p.summary["output_tok_per_s"] or 0.0 for p in points]
    figures = []
    for name in ("ttft_ms", "tpot_ms"):
        series = [("p50", GREEN), ("p99", RED)]
        ys = {q: [p.summary[name][q] for p in points] for q, _ in series}
        values = [v for vs in ys.values() for v in vs if v is not None]
        if not values:
            continue
        chart = Chart(
            f"{name} vs throughput",
            "output tokens/s",
            f"{name} (ms)",
            Scale.fit([*throughput, 1.1 * max(throughput)]),  # room for the last label
            Scale.fit(values),
            width=470,
            height=300,
            legend_at_bottom=True,  # latency rises with throughput: bottom-right stays empty
        )
        for q, colour in series:
            pairs = [(t, v) for t, v in zip(throughput, ys[q], strict=True) if v is not None]
            chart.line([t for t, _ in pairs], [v for _, v in pairs], colour, q)
            chart.points([t for t, _ in pairs], [v for _, v in pairs], colour)
        for t, v, p in zip(throughput, ys["p50"], points, strict=True):
            if v is not None:
                chart.label(t, v, f"{p.results.get('sweep_point'):g}")
        figures.append(
            Figure(
                f"sweep-{name}",
                chart.svg(),
                "Each marker is one sweep point, labelled with its rate or concurrency.",
            )
        )
    return figures
