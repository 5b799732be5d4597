"""Every figure of a run's report, drawn with matplotlib from a `RunData` (None: no data).

roofline · TTFT and TPOT CDFs · ITL histogram · server vs client · timeline panels · session
waterfall · sweep curves.
"""

from __future__ import annotations

import math

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from llmbench.harness import metrics
from llmbench.reports import link_roof
from llmbench.reports.figure import (
    BLUE,
    GREEN,
    GREY,
    ORANGE,
    PURPLE,
    RED,
    Plot,
    hover,
    new_axes,
    styled,
)
from llmbench.reports.roofline_axes import (
    SI_TICKS,
    draw_roof,
    draw_steps,
    log_axes,
    scatter_legend,
)
from llmbench.reports.rundata import RunData
from llmbench.reports.tables import si

PHASE_COLOURS = {"decode": BLUE, "prefill": ORANGE, "mixed": GREEN}
MAX_POINTS = 4000  # roofline points drawn; a longer run is thinned evenly (the table has all)
WIDE_IN, SMALL_IN = 12.0, (3.85, 2.9)  # figure sizes in inches (96 CSS px each)


@styled
def measured_steps(run: RunData) -> list[tuple[int, dict]]:
    """(index in steps.jsonl, step) of the measured repetitions' steps: the warm-up's
    (repetition 0) are left out, as the roofline table and MBU leave them out."""
    return [(i, s) for i, s in enumerate(run.steps) if s.get("repetition", 1) >= 1]


def roofline(run: RunData) -> Plot | None:
    """Log-log roofline: measured roofs (solid), datasheet roofs (dashed), every measured step
    a point coloured by phase and sized by its batch; the legend counts the steps as the
    roofline table does (an estimated point stands for its `num_steps`)."""
    roof = run.results.get("roofline")
    measured = measured_steps(run)
    steps = [
        (i, s)
        for i, s in measured
        if s["t_end_ns"] > s["t_start_ns"] and s["bytes"] > 0 and s["flops"] > 0
    ]
    if roof is None or not steps:
        return None
    stride = max(1, math.ceil(len(steps) / MAX_POINTS))
    steps = steps[::stride]
    seconds = np.array([(s["t_end_ns"] - s["t_start_ns"]) / 1e9 for _, s in steps])
    flops = np.array([s["flops"] for _, s in steps], dtype=float)
    intensity = flops / np.array([s["bytes"] for _, s in steps], dtype=float)
    achieved = flops / seconds
    roofs = [r for r in (roof.get("roofs"), roof.get("datasheet_roofs")) if r and r["flops_per_s"]]
    ridges = [r["flops_per_s"] / r["read_bytes_per_s"] for r in roofs]
    title = "Roofline" + (" (estimated from the client)" if roof.get("is_estimated") else "")
    figure, ax = new_axes((6.0, 4.3), title, "arithmetic intensity (FLOP/byte)", "achieved FLOP/s")
    link = link_roof.link_roof(run)  # offloaded weights crossed the host link
    link_x = link_roof.link_intensity(steps) if link else []
    log_axes(
        ax,
        [*intensity, *link_x, *ridges, *(4 * x for x in ridges)],
        [*achieved, *(r["flops_per_s"] for r in roofs)],
    )
    for r, style in (
        (roof.get("roofs"), {}),
        (roof.get("datasheet_roofs"), {"color": RED, "linestyle": "--"}),
    ):
        if r:
            draw_roof(ax, r["label"], r["read_bytes_per_s"], r["flops_per_s"], **style)
    if link:
        peak = (roof.get("roofs") or {}).get("flops_per_s")
        link_roof.draw_link(ax, link, peak, steps, achieved)
    for phase, colour in PHASE_COLOURS.items():
        count = sum(s.get("num_steps", 1) for _, s in measured if s["phase"] == phase)
        label = f"{phase} steps ({count:,.0f})"
        draw_steps(ax, steps, seconds, intensity, achieved, phase, label, color=colour, alpha=0.6)
    scatter_legend(ax)
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
    if link:
        caption += (
            f" Hollow: the steps that fetched offloaded weights, at FLOPs per byte over the "
            f"{link.label} ({si(link.bytes_per_s, 'B/s')}, dash-dot); on that roof the link "
            "bounds them."
        )
    num_warmup = len(run.steps) - len(measured)
    if num_warmup:
        caption += f" The {num_warmup:,} warm-up steps are left out, as in the table."
    if stride > 1:
        caption += f" Every {stride}th step of {len(measured):,} is drawn."
    return Plot("roofline", figure, caption)


@styled
def latency_cdf(run: RunData, name: str) -> Plot | None:
    """Empirical CDF of one per-request latency, `ttft_ms` or `tpot_ms`, with its SLO."""
    fn = {"ttft_ms": metrics.ttft_ms, "tpot_ms": metrics.tpot_ms}[name]
    values = np.sort([v for v in (fn(r) for r in run.requests) if v is not None])
    if not values.size:
        return None
    slo = run.results.get("spec", {}).get("slo", {}).get(name)
    slo_in_view = slo is not None and slo <= 2 * values[-1]  # else it squashes the curve
    title = f"{name.removesuffix('_ms').upper()} CDF"
    figure, ax = new_axes(SMALL_IN, title, f"{name} (ms)", "fraction of requests")
    ax.ecdf(values, color=BLUE, label=f"{len(values)} requests")
    if slo_in_view:
        ax.axvline(slo, color=RED, linestyle="--", lw=1.2, label=f"SLO {slo:g} ms")
    quantiles = (50, 90, 99)
    at = np.percentile(values, quantiles)
    marks = ax.scatter(at, [q / 100 for q in quantiles], s=14, color="#222222", zorder=3)
    hover(marks, [f"p{q}: {v:.2f} ms" for q, v in zip(quantiles, at, strict=True)])
    ax.set(xlim=(0, 1.05 * max(values[-1], slo if slo_in_view else 0)), ylim=(0, 1.02))
    ax.legend(loc="lower right")
    caption = f"p50 {at[0]:.1f} ms, p99 {at[2]:.1f} ms, max {values[-1]:.1f} ms (dots: p50/90/99)."
    if slo is not None and not slo_in_view:
        caption += f" The SLO ({slo:g} ms) is off the chart, far right of every request."
    return Plot(name.removesuffix("_ms") + "-cdf", figure, caption)


@styled
def itl_histogram(run: RunData) -> Plot | None:
    """Inter-token latencies, one sample per token (a chunk of k tokens gives k samples)."""
    samples = np.array([s for r in run.requests for s in metrics.itl_samples_ms(r)])
    if not samples.size:
        return None
    top = float(np.percentile(samples, 99.5)) or float(samples.max()) or 1.0  # all-zero: any
    counts, edges = np.histogram(samples, bins=40, range=(0.0, top))
    figure, ax = new_axes(SMALL_IN, "ITL histogram", "inter-token latency (ms)", "tokens")
    drawn = np.flatnonzero(counts)
    bars = ax.bar(
        edges[drawn],
        counts[drawn],
        width=top / 40,
        align="edge",
        color=BLUE,
        alpha=0.85,
        label=f"{samples.size} token gaps",
    )
    hover(bars, [f"{edges[i]:.3g}–{edges[i + 1]:.3g} ms: {counts[i]} tokens" for i in drawn])
    ax.set_xlim(0, top)
    ax.legend(loc="upper right")
    p50, p99 = np.percentile(samples, [50, 99])
    caption = (
        f"p50 {p50:.1f} ms, p99 {p99:.1f} ms; {int((samples > top).sum())} samples beyond "
        f"{top:.1f} ms (p99.5) are not drawn."
    )
    return Plot("itl-histogram", figure, caption)


# The server-vs-client scatters: (client metric, server metric, title, x label, y label).
_SPLITS = {
    "ttft": (
        metrics.ttft_from_send_ms,
        metrics.server_prompt_ms,
        "TTFT: client vs server",
        "server prompt time (ms)",
        "client TTFT from send (ms)",
    ),
    "tpot": (
        metrics.tpot_ms,
        metrics.server_decode_ms_per_token,
        "TPOT: client vs server",
        "server decode per token (ms)",
        "client TPOT (ms)",
    ),
}


@styled
def server_client(run: RunData, which: str) -> Plot | None:
    """Each request's client-side time against the server's own for the same work (`which`:
    "ttft", TTFT from the send vs the server's prompt time; "tpot", TPOT vs its decode time per
    token), with the diagonal where the client would add nothing. None without server timings."""
    client, server, title, x_label, y_label = _SPLITS[which]
    pairs = [(server(r), client(r)) for r in run.requests if r.ok]
    pairs = [(x, y) for x, y in pairs if x is not None and y is not None]
    if not pairs:
        return None
    x, y = np.array(pairs).T
    top = 1.05 * float(max(x.max(), y.max())) or 1.0
    figure, ax = new_axes(SMALL_IN, title, x_label, y_label)
    ax.plot([0, top], [0, top], color=GREY, linestyle="--", lw=1, label="no overhead")
    marks = ax.scatter(x, y, s=12, color=BLUE, alpha=0.7, label=f"{len(x)} requests")
    hover(marks, [f"server {a:.2f} ms, client {b:.2f} ms: +{b - a:.2f} ms" for a, b in pairs])
    ax.set(xlim=(0, top), ylim=(0, top))
    ax.legend(loc="upper left")
    p50, p99 = np.percentile(y - x, [50, 99])
    caption = (
        f"Overhead (client − server, per request) p50 {p50:.2f} ms, p99 {p99:.2f} ms; a point "
        "on the dashed line is a request where the client saw exactly the server's time."
    )
    return Plot(f"server-client-{which}", figure, caption)


def time_buckets(run: RunData) -> tuple[float, int]:
    """Width (s) and count of the timeline's buckets: about 60 of a readable width, from the
    first measured send to the last end."""
    ends = [r.end_ns for r in run.requests if r.end_ns] + [s["t_end_ns"] for s in run.steps]
    span_s = max((max(ends, default=run.t0_ns) - run.t0_ns) / 1e9, 1e-3)
    raw = max(span_s / 60, 0.05)
    width_s = next((w for w in (0.1, 0.2, 0.5, 1, 2, 5, 10, 30, 60) if w >= raw), 60.0)
    return width_s, int(span_s / width_s) + 1


def per_bucket(times_ns, weights, t0: int, width_s: float, num: int) -> np.ndarray:
    """Σ weights of the events in each time bucket; times outside the run go to the end ones."""
    seconds = (np.asarray(times_ns, dtype=float) - t0) / 1e9
    index = np.clip(seconds // width_s, 0, num - 1).astype(int)
    return np.bincount(index, weights=np.asarray(weights, dtype=float), minlength=num)


def _panel(title: str, y_label: str, end_s: float, height_in: float = 2.2) -> tuple[Figure, Axes]:
    """A full-width panel over the run's time, with fixed margins so the panels line up."""
    figure, ax = new_axes((WIDE_IN, height_in), title, "time (s)", y_label, constrained=False)
    figure.subplots_adjust(
        left=0.8 / WIDE_IN, right=1 - 0.2 / WIDE_IN, bottom=0.5 / height_in, top=1 - 0.4 / height_in
    )
    ax.set_xlim(0, end_s)
    return figure, ax


def _finish(ax: Axes, handles: list | None = None) -> None:
    """The y axis from zero, and the legend in one row above the plot, right of the title."""
    ax.set_ylim(bottom=0)
    handles = handles or ax.get_legend_handles_labels()[0]
    ax.legend(
        handles=handles,
        loc="lower right",
        bbox_to_anchor=(1, 1),
        ncols=len(handles),
        frameon=False,
        borderaxespad=0.2,
    )


def _points(ax: Axes, xs, ys, text: str, **style) -> None:
    """A marker per known (x, y), hovering `text` formatted with them; None values skipped."""
    pairs = [(x, y) for x, y in zip(xs, ys, strict=True) if y is not None]
    marks = ax.scatter([x for x, _ in pairs], [y for _, y in pairs], zorder=3, **style)
    hover(marks, [text.format(x=x, y=y) for x, y in pairs])


@styled
def timeline(run: RunData) -> list[Plot]:
    """Panels over the run's time: tokens/s, sequences, KV blocks, utilisation, prefix hits,
    telemetry."""
    t0 = run.t0_ns
    chunks = [(t, k) for r in run.requests for t, k in zip(r.chunk_ns, r.chunk_tokens, strict=True)]
    if not chunks and not run.steps:
        return []
    width_s, num = time_buckets(run)
    edges = np.arange(num + 1) * width_s
    centres = (edges[:-1] + edges[1:]) / 2
    plots = []

    # Tokens/s: output tokens by arrival; prefill tokens by engine step.
    figure, ax = _panel("Throughput", "tokens/s", edges[-1])
    ax.yaxis.set_major_formatter(SI_TICKS)
    out = per_bucket([t for t, _ in chunks], [k for _, k in chunks], t0, width_s, num)
    ax.stairs(out / width_s, edges, color=BLUE, lw=1.6, label="output tokens/s")
    prefill = [s.get("num_prefill_tokens", 0) for s in run.steps]
    if any(prefill):
        prefill_per_s = per_bucket([s["t_end_ns"] for s in run.steps], prefill, t0, width_s, num)
        ax.stairs(prefill_per_s / width_s, edges, color=ORANGE, lw=1.6, label="prefill tokens/s")
    _finish(ax)
    caption = f"In {width_s:g} s buckets from the first measured send; prefill from engine steps."
    plots.append(Plot("timeline-tokens", figure, caption))

    # Sequences: running and waiting per engine step; requests in flight from the client.
    engine_steps = [s for s in run.steps if "context_lens" in s]
    step_ts = [(s["t_end_ns"] - t0) / 1e9 for s in engine_steps]
    spans = [((r.sent_ns - t0) / 1e9, (r.end_ns - t0) / 1e9) for r in run.requests if r.end_ns]
    figure, ax = _panel("Sequences", "sequences", edges[-1])
    in_flight = [sum(1 for a, b in spans if a <= c < b) for c in centres]
    ax.stairs(in_flight, edges, color=PURPLE, label="requests in flight (client)")
    if engine_steps:
        running = [len(s["context_lens"]) for s in engine_steps]
        waiting = [s.get("num_waiting", 0) for s in engine_steps]
        ax.step(step_ts, running, where="post", color=BLUE, lw=1.2, label="running (engine)")
        ax.step(step_ts, waiting, where="post", color=ORANGE, lw=1.2, label="waiting (engine)")
    _finish(ax)
    caption = (
        "Sequences the engine ran and kept waiting in each step; requests the client had open."
    )
    plots.append(Plot("timeline-sequences", figure, caption))

    if engine_steps and engine_steps[0].get("num_blocks_total"):
        figure, ax = _panel("KV cache", "blocks in use (%)", edges[-1], 2.0)
        used = [100 * s["num_blocks_used"] / s["num_blocks_total"] for s in engine_steps]
        label = f"of {engine_steps[0]['num_blocks_total']} blocks"
        ax.step(step_ts, used, where="post", color=GREEN, label=label)
        preempted = [s.get("num_preempted", 0) for s in engine_steps]
        if any(preempted):
            _points(
                ax,
                step_ts,
                [97.0 if n else None for n in preempted],
                "{x:.3f} s: preempted",
                color=RED,
                marker="v",
                label=f"preemptions ({sum(preempted)})",
            )
        ax.set_ylim(0, 100)
        _finish(ax)
        caption = "KV blocks held by sequences and the prefix cache's live blocks."
        plots.append(Plot("timeline-kv", figure, caption))

    utilization = _utilization(run, t0, width_s, num)
    if utilization is not None:
        figure, ax = _panel("Utilisation over time", "share of the roof", edges[-1])
        for (label, series), colour in zip(utilization.items(), (BLUE, ORANGE), strict=False):
            text = "{x:.2f} s: " + label + " {y:.3f}"
            _points(ax, centres, series, text, color=colour, s=18, label=label)
        _finish(ax)
        caption = (
            "Per bucket: Σ bytes / Σ time of its decode-only steps over the read roof (MBU), "
            "and Σ FLOPs / Σ time of its steps with prompt tokens over the matmul roof (MFU)."
        )
        plots.append(Plot("timeline-utilisation", figure, caption))

    if any(r.cached_tokens for r in run.requests):
        reporting = [r for r in run.requests if r.cached_tokens is not None]
        sent = [r.sent_ns for r in reporting]
        prompt = [r.server_prompt_tokens or r.num_prompt_tokens for r in reporting]
        prompt_sums = per_bucket(sent, prompt, t0, width_s, num)
        cached_sums = per_bucket(sent, [r.cached_tokens for r in reporting], t0, width_s, num)
        hits = [c / p if p else None for c, p in zip(cached_sums, prompt_sums, strict=True)]
        figure, ax = _panel("Prefix-cache hits", "cached / prompt tokens", edges[-1], 2.0)
        _points(
            ax,
            centres,
            hits,
            "{x:.2f} s: hit rate {y:.2f}",
            color=GREEN,
            s=18,
            label="hit rate of requests sent",
        )
        ax.set_ylim(0, 1.02)
        _finish(ax)
        caption = "Prompt tokens served from the prefix cache, by send time."
        plots.append(Plot("timeline-prefix", figure, caption))

    if run.telemetry:
        plots.append(_telemetry(run, t0, edges[-1]))
    return plots


def _utilization(
    run: RunData, t0: int, width_s: float, num: int
) -> dict[str, list[float | None]] | None:
    """Decode MBU and prefill (+ mixed) MFU per time bucket; None without roofs or steps.

    Formula: MBU = Σ bytes / Σ seconds of the bucket's decode steps / read roof;
    MFU = Σ FLOPs / Σ seconds of its other steps / matmul roof; None where Σ seconds = 0."""
    roofs = (run.results.get("roofline") or {}).get("roofs")
    if not roofs or not run.steps:
        return None
    ends = [s["t_end_ns"] for s in run.steps]
    decode = np.array([s["phase"] == "decode" for s in run.steps])
    seconds = np.array([(s["t_end_ns"] - s["t_start_ns"]) / 1e9 for s in run.steps])

    def rate(key: str, mask: np.ndarray, roof: float) -> list[float | None]:
        amount = per_bucket(ends, [s[key] for s in run.steps] * mask, t0, width_s, num)
        time_s = per_bucket(ends, seconds * mask, t0, width_s, num)
        return [a / t / roof if t > 0 else None for a, t in zip(amount, time_s, strict=True)]

    shares = {"decode MBU": rate("bytes", decode, roofs["read_bytes_per_s"])}
    if roofs["flops_per_s"]:  # a matmul rate not measured: no MFU
        shares["prefill and mixed MFU"] = rate("flops", ~decode, roofs["flops_per_s"])
    return shares


_TELEMETRY_SERIES = (
    ("process_cpu_percent", "process CPU %", BLUE),
    ("system_cpu_percent", "all cores CPU %", GREY),
    ("gpu_util_percent", "GPU util %", GREEN),
    ("mem_util_percent", "GPU memory-bus util %", ORANGE),
)


def _telemetry(run: RunData, t0: int, end_s: float) -> Plot:
    """CPU and GPU use over the run; the RSS and power peaks in the caption."""
    rows = run.telemetry
    ts = np.array([(row["t_ns"] - t0) / 1e9 for row in rows])
    figure, ax = _panel("Telemetry", "percent", end_s)
    for key, label, colour in _TELEMETRY_SERIES:
        if key in rows[0]:
            ax.plot(ts, [row.get(key, math.nan) for row in rows], color=colour, lw=1.2, label=label)
    _finish(ax)
    extra = []
    if "rss_bytes" in rows[0]:
        extra.append(f"RSS max {si(max(row['rss_bytes'] for row in rows), 'B')}")
    if "power_w" in rows[0]:
        extra.append(f"power max {max(row['power_w'] for row in rows):.0f} W")
    gap_s = float(np.median(np.diff(ts))) if len(ts) > 1 else 0.0
    caption = f"Sampled every ~{gap_s * 1e3:.0f} ms. " + "; ".join(extra)
    return Plot("timeline-telemetry", figure, caption)


@styled
def session_waterfall(run: RunData, max_sessions: int = 40) -> Plot | None:
    """One row per session: each request's wait for the first token, then its decode, and the
    tool / think time between them as the gaps."""
    by_session: dict[str, list] = {}
    for r in run.requests:
        by_session.setdefault(r.session_id, []).append(r)
    if not by_session or all(len(rs) < 2 for rs in by_session.values()):
        return None
    t0 = run.t0_ns
    ids = sorted(by_session, key=lambda s: min(r.sent_ns for r in by_session[s]))[:max_sessions]
    width_s, num = time_buckets(run)  # the timeline's x range: the panels line up
    figure, ax = _panel("Sessions", "session", width_s * num, 0.9 + 0.22 * len(ids))
    spans = []  # (row, start s, end s, colour, hover text)
    for row, session in enumerate(ids):
        for r in by_session[session]:
            sent, end = (r.sent_ns - t0) / 1e9, (r.end_ns - t0) / 1e9
            first = (r.chunk_ns[0] - t0) / 1e9 if r.chunk_ns else end
            wait_ms, decode_ms = (first - sent) * 1e3, (end - first) * 1e3
            spans.append(
                (row, sent, first, ORANGE, f"{r.request_id}: first token {wait_ms:.1f} ms")
            )
            if r.end_ns:
                text = f"{r.request_id}: {r.num_output_tokens} tokens in {decode_ms:.1f} ms"
                spans.append((row, first, end, BLUE if r.ok else RED, text))
    rows, starts, stops, colours, texts = zip(*spans, strict=True)
    bars = ax.barh(
        rows, np.subtract(stops, starts), left=starts, height=0.7, color=colours, edgecolor=colours
    )
    hover(bars, texts)
    legend = [
        Patch(color=ORANGE, label="sent → first token"),
        Patch(color=BLUE, label="first token → end"),
    ]
    if any(not r.ok for r in run.requests):
        legend.append(Patch(color=RED, label="failed request"))
    _finish(ax, legend)
    ax.set_yticks(range(len(ids)), labels=ids)
    ax.set_ylim(len(ids) - 0.5, -0.5)  # first session on top
    ax.grid(axis="y", visible=False)
    shown = f"the first {len(ids)} of {len(by_session)}" if len(by_session) > len(ids) else "all"
    caption = (
        f"Sessions in order of their start ({shown}); the gaps between a session's "
        "requests are tool latency or think time."
    )
    return Plot("sessions", figure, caption)


@styled
def sweep_curves(points: list[RunData]) -> list[Plot]:
    """Latency against throughput, one marker per sweep point, labelled with its load."""
    if len(points) < 2:
        return []
    throughput = [p.summary["output_tok_per_s"] or 0.0 for p in points]
    plots = []
    for name in ("ttft_ms", "tpot_ms"):
        if all(p.summary[name]["p50"] is None for p in points):
            continue
        title = f"{name} vs throughput"
        figure, ax = new_axes((5.9, 3.6), title, "output tokens/s", f"{name} (ms)")
        for q, colour in (("p50", GREEN), ("p99", RED)):
            known = [
                (t, p)
                for t, p in zip(throughput, points, strict=True)
                if p.summary[name][q] is not None
            ]
            ys = [p.summary[name][q] for _, p in known]
            ax.plot([t for t, _ in known], ys, color=colour, label=q)
            text = "{x:.1f} tok/s: " + q + " {y:.1f} ms"
            _points(ax, [t for t, _ in known], ys, text, color=colour, s=22)
            for (t, p), y in zip(known, ys if q == "p50" else [], strict=False):
                load = f"{p.results.get('sweep_point'):g}"
                ax.annotate(load, (t, y), xytext=(4, 4), textcoords="offset points")
        ax.set(xlim=(0, 1.1 * max(throughput) or 1.0), ylim=(0, None))  # room for the labels
        ax.legend(loc="upper left")  # latency rises with throughput: the top left stays empty
        caption = "Each marker is one sweep point, labelled with its rate or concurrency."
        plots.append(Plot(f"sweep-{name}", figure, caption))
    return plots
