"""What each figure plots, read back from the matplotlib objects, against hand-computed values
from small made-up runs."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

import numpy as np
import pytest
from matplotlib.colors import to_hex

from llmbench.harness.records import RequestRecord
from llmbench.reports import plots
from llmbench.reports.figure import RED
from llmbench.reports.rundata import RunData

S, MS = 1_000_000_000, 1_000_000  # ns


def _run(
    steps: list[dict] | None = None,
    requests: list[RequestRecord] | None = None,
    roofline: dict | None = None,
    slo: dict | None = None,
    summary: dict | None = None,
) -> RunData:
    """A run held in memory; the figures read only these fields (others, such as the typed
    result, are None)."""
    given = {
        "folder": Path("."),
        "results": {
            "summary": summary or {},
            "provenance": {},
            "roofline": roofline,
            "spec": {"slo": slo or {}},
        },
        "requests": requests or [],
        "steps": steps or [],
        "sessions": [],
        "telemetry": [],
    }
    return RunData(**{f.name: given.get(f.name) for f in fields(RunData)})


def _step(start_s: float, end_s: float, phase: str, flops: float, num_bytes: float, **kw) -> dict:
    return {
        "t_start_ns": int(start_s * S),
        "t_end_ns": int(end_s * S),
        "phase": phase,
        "flops": flops,
        "bytes": num_bytes,
        **kw,
    }


def _request(rid: str, session: str, sent_ms: int, token_ms: list[int], **kw) -> RequestRecord:
    """A request sent (and scheduled) at `sent_ms`, one token at each of `token_ms`."""
    return RequestRecord(
        request_id=rid,
        session_id=session,
        turn=0,
        scheduled_ns=sent_ms * MS,
        sent_ns=sent_ms * MS,
        end_ns=(token_ms[-1] if token_ms else sent_ms) * MS,
        chunk_ns=[t * MS for t in token_ms],
        chunk_tokens=[1] * len(token_ms),
        num_prompt_tokens=10,
        **kw,
    )


MEASURED = {"label": "measured X", "read_bytes_per_s": 2e12, "flops_per_s": 5e14}
DATASHEET = {"label": "datasheet H100-SXM", "read_bytes_per_s": 3.35e12, "flops_per_s": 989e12}


def test_roofline_plots_each_steps_intensity_and_achieved_flops_on_log_axes():
    steps = [
        _step(0.0, 0.001, "decode", 2e9, 1e9, num_seqs=1),  # 2 FLOP/B at 2 TFLOP/s
        _step(0.001, 0.003, "decode", 8e9, 2e9, num_seqs=4),  # 4 FLOP/B at 4 TFLOP/s
        _step(0.0, 0.010, "prefill", 5e11, 1e9, num_seqs=1),  # 500 FLOP/B at 50 TFLOP/s
        _step(0.5, 0.5, "decode", 1e9, 1e9),  # no duration: no point
    ]
    run = _run(steps, roofline={"roofs": MEASURED, "datasheet_roofs": DATASHEET})
    plot = plots.roofline(run)
    ax = plot.figure.axes[0]
    assert plot.key == "roofline"
    assert (ax.get_xscale(), ax.get_yscale()) == ("log", "log")
    # A collection per (phase, batch): each batch size's markers are drawn once, then reused.
    one, four, prefill = ax.collections[-3:]
    assert np.allclose(one.get_offsets(), [[2.0, 2e12]])
    assert np.allclose(four.get_offsets(), [[4.0, 4e12]])
    assert np.allclose(prefill.get_offsets(), [[500.0, 5e13]])
    assert [c.get_sizes().tolist() for c in (one, four)] == [[10 + 12 * 1], [10 + 12 * 2]]  # √batch
    assert four.get_urls() == ["decode step 1: 4 sequences, 2 ms, 4 FLOP/B, 4TFLOP/s"]
    # Axes hold the points, both ridges (250 and 295 FLOP/B) and 4x past them, in decades.
    assert ax.get_xlim() == (1.0, 10_000.0) and ax.get_ylim() == (1e12, 1e15)
    measured, datasheet = ax.lines
    assert measured.get_xdata().tolist() == [1.0, 250.0, 10_000.0]
    assert measured.get_ydata().tolist() == [2e12, 5e14, 5e14]  # min(AI x bandwidth, peak)
    assert datasheet.get_linestyle() == "--" and to_hex(datasheet.get_color()) == RED.lower()
    assert measured.get_linestyle() == "-"
    ridge = ax.collections[0]  # the dotted line at the measured ridge
    assert ridge.get_segments()[0].tolist() == [[250.0, 1e12], [250.0, 5e14]]
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend == [
        "measured X: 2TB/s, 500TFLOP/s",
        "datasheet H100-SXM: 3.35TB/s, 989TFLOP/s",
        "decode steps (3)",
        "prefill steps (1)",
    ]


def test_the_roofline_counts_and_draws_the_measured_steps_as_the_table_does():
    """Warm-up steps (repetition 0) are in steps.jsonl but not in the table's counts or MBU:
    the legend counts what the table counts (391 vs 360 before), and only those are drawn."""
    from llmbench.roofline.analysis import phase_utilization

    warmup = [_step(0.0, 0.001, "decode", 1e9, 1e9, repetition=0, num_seqs=1)] * 3
    warmup += [_step(0.0, 0.010, "prefill", 5e11, 1e9, repetition=0, num_seqs=1)]
    measured = [_step(0.01, 0.011, "decode", 2e9, 1e9, repetition=1, num_seqs=1)] * 2
    measured += [_step(0.02, 0.03, "prefill", 5e11, 1e9, repetition=2, num_seqs=1)]
    measured += [_step(0.04, 0.041, "decode", 2e9, 1e9, num_seqs=1)]  # from before repetitions
    run = _run([*warmup, *measured], roofline={"roofs": MEASURED})
    plot = plots.roofline(run)
    ax = plot.figure.axes[0]
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    table = phase_utilization(measured, 2e12, 5e14)  # what run_summary puts in the table
    assert (table["decode"]["num_steps"], table["prefill"]["num_steps"]) == (3, 1)
    assert legend[1:] == ["decode steps (3)", "prefill steps (1)"]
    drawn = [url.split(":")[0] for c in ax.collections[1:] for url in c.get_urls()]
    assert sorted(drawn) == ["decode step 4", "decode step 5", "decode step 7", "prefill step 6"]
    assert "The 4 warm-up steps are left out, as in the table." in plot.caption
    # An estimated point stands for several steps: counted as the table counts them.
    windows = [
        _step(0.0, 1.0, "decode", 2e9, 1e9, num_steps=12.5, repetition=1, num_seqs=2),
        _step(1.0, 2.0, "decode", 2e9, 1e9, num_steps=7.5, repetition=1, num_seqs=2),
    ]
    estimated = plots.roofline(_run(windows, roofline={"roofs": MEASURED, "is_estimated": True}))
    texts = [t.get_text() for t in estimated.figure.axes[0].get_legend().get_texts()]
    assert texts[1:] == ["decode steps (20)"]
    assert "warm-up" not in estimated.caption


def test_a_roof_without_a_flops_peak_is_its_slanted_line_alone():
    steps = [_step(0.0, 0.001, "decode", 2e9, 1e9), _step(0.001, 0.002, "prefill", 4e9, 1e9)]
    roofs = {"label": "measured X", "read_bytes_per_s": 2e12, "flops_per_s": None}
    ax = plots.roofline(_run(steps, roofline={"roofs": roofs})).figure.axes[0]
    (line,) = ax.lines
    assert line.get_xdata().tolist() == [1.0, 10.0]  # the points' decade: 2 and 4 FLOP/B
    assert line.get_ydata().tolist() == [2e12, 2e13]
    assert line.get_label() == "measured X: 2TB/s (no FLOP/s roof)"
    util = plots._utilization(_run(steps, roofline={"roofs": roofs}), 0, 1.0, 1)
    assert list(util) == ["decode MBU"]  # no MFU without a matmul rate


def test_roofline_needs_roofs_and_timed_steps():
    assert plots.roofline(_run([_step(0, 1, "decode", 1, 1)], roofline=None)) is None
    assert plots.roofline(_run([_step(1, 1, "decode", 1, 1)], roofline={"roofs": MEASURED})) is None


def test_ttft_cdf_is_the_sorted_ttfts_with_the_slo_line():
    requests = [_request(f"r{i}", "s", 0, [ttft, ttft + 5]) for i, ttft in enumerate((30, 10, 20))]
    plot = plots.latency_cdf(_run(requests=requests, slo={"ttft_ms": 25}), "ttft_ms")
    ax = plot.figure.axes[0]
    cdf, slo = ax.lines
    assert cdf.get_xdata()[1:].tolist() == [10.0, 20.0, 30.0]  # after the rise from 0 at x[0]
    assert cdf.get_ydata().tolist() == pytest.approx([0, 1 / 3, 2 / 3, 1])
    assert slo.get_xdata() == [25, 25] and slo.get_label() == "SLO 25 ms"
    # p50, p90, p99 of [10, 20, 30] by linear interpolation: 20, 28, 29.8.
    dots = np.array([[20, 0.5], [28, 0.9], [29.8, 0.99]])
    assert np.allclose(ax.collections[0].get_offsets(), dots)
    assert plot.caption == "p50 20.0 ms, p99 29.8 ms, max 30.0 ms (dots: p50/90/99)."


def test_a_far_slo_is_left_off_the_cdf_and_said_in_the_caption():
    requests = [_request("r", "s", 0, [10, 12, 14])]
    plot = plots.latency_cdf(_run(requests=requests, slo={"tpot_ms": 50}), "tpot_ms")
    assert [line.get_label() for line in plot.figure.axes[0].lines] == ["1 requests"]
    assert plot.figure.axes[0].lines[0].get_xdata()[1:].tolist() == [2.0]  # (14 − 10) / 2
    assert plot.caption.endswith("The SLO (50 ms) is off the chart, far right of every request.")
    assert plots.latency_cdf(_run(), "ttft_ms") is None


def test_itl_histogram_bars_are_the_gap_counts_up_to_p99_5():
    # Gaps 1, 1, 1, 2, 10 ms; p99.5 = 2 + 0.98 x (10 − 2) = 9.84 ms, so 40 bins of 0.246 ms.
    plot = plots.itl_histogram(_run(requests=[_request("r", "s", 0, [5, 6, 7, 8, 10, 20])]))
    ax = plot.figure.axes[0]
    bars = ax.patches
    assert [b.get_height() for b in bars] == [3, 1]  # empty bins draw nothing
    assert [b.get_x() for b in bars] == pytest.approx([4 * 0.246, 8 * 0.246])
    assert ax.get_xlim() == pytest.approx((0, 9.84))
    assert bars[0].get_url() == "0.984–1.23 ms: 3 tokens"
    assert plot.caption == "p50 1.0 ms, p99 9.7 ms; 1 samples beyond 9.8 ms (p99.5) are not drawn."


def test_time_buckets_and_sums_per_bucket():
    run = _run(requests=[_request("r", "s", 1000, [1500, 4000])])  # 3 s from first send to end
    assert plots.time_buckets(run) == (0.1, 31)  # 3 s / 60 → 0.05, rounded up to 0.1 s
    sums = plots.per_bucket([0, 1 * S, 1.5 * S, 9 * S, -S], [1, 2, 3, 4, 5], 0, 1.0, 3)
    assert sums.tolist() == [1 + 5, 2 + 3, 4]  # outside the run: the first or last bucket


def test_utilisation_per_time_bucket():
    steps = [
        # Bucket 0 (steps ending before 2 s): 400 B of decode over the steps' own 1.5 s.
        _step(0.0, 1.0, "decode", 10, 100),
        _step(1.0, 1.5, "decode", 10, 300),
        # Bucket 1: a decode second with no bytes; 250 prompt-step FLOPs over 1 s.
        _step(1.5, 2.5, "decode", 0, 0),
        _step(2.5, 3.0, "prefill", 100, 50),
        _step(3.0, 3.5, "mixed", 150, 50),
    ]
    roofs = {"read_bytes_per_s": 1000.0, "flops_per_s": 500.0}
    util = plots._utilization(_run(steps, roofline={"roofs": roofs}), t0=0, width_s=2.0, num=3)
    assert util["decode MBU"] == [pytest.approx(400 / 1.5 / 1000), 0.0, None]
    assert util["prefill and mixed MFU"] == [None, pytest.approx(250 / 1.0 / 500), None]
    assert plots._utilization(_run(steps, roofline=None), 0, 2.0, 3) is None  # no roofs


def test_timeline_panels_plot_tokens_per_second_sequences_and_kv_blocks():
    # Two requests from t = 0; tokens at 50, 60 ms and 150 ms; the engine's steps end at 50 and
    # 150 ms with 2 and then 1 running sequences; one preemption at 150 ms.
    requests = [
        _request("a", "s0", 0, [50, 60], cached_tokens=5),
        _request("b", "s1", 0, [150], cached_tokens=0),
    ]
    engine = {"num_blocks_total": 10, "num_waiting": 0}
    steps = [
        _step(0.0, 0.05, "prefill", 1e6, 1e6, context_lens=[10, 10], num_prefill_tokens=20,
              num_blocks_used=4, **engine),
        _step(0.14, 0.15, "decode", 1e6, 1e6, context_lens=[11], num_blocks_used=2,
              num_preempted=1, **engine),
    ]  # fmt: skip
    run = _run(steps, requests, roofline={"roofs": MEASURED})
    panels = {p.key: p for p in plots.timeline(run)}
    assert list(panels) == [
        "timeline-tokens",
        "timeline-sequences",
        "timeline-kv",
        "timeline-utilisation",
        "timeline-prefix",
    ]
    tokens = panels["timeline-tokens"].figure.axes[0]
    output, prefill = (patch.get_data() for patch in tokens.patches)
    assert output.edges.tolist() == pytest.approx([0.0, 0.1, 0.2])
    assert output.values.tolist() == pytest.approx([2 / 0.1, 1 / 0.1])  # tokens / bucket width
    assert prefill.values.tolist() == pytest.approx([20 / 0.1, 0])
    assert tokens.get_ylim() == (0, pytest.approx(200 * 1.05))  # from zero, room above the top
    sequences = panels["timeline-sequences"].figure.axes[0]
    # In flight at the bucket centres 0.05 and 0.15 s: both, then none (b ends at 0.15 s).
    assert sequences.patches[0].get_data().values.tolist() == [2, 0]
    running = sequences.lines[0]
    assert np.allclose(running.get_xydata(), [[0.05, 2], [0.15, 1]])
    kv = panels["timeline-kv"].figure.axes[0]
    assert np.allclose(kv.lines[0].get_ydata(), [40.0, 20.0])  # percent of the 10 blocks
    assert np.allclose(kv.collections[0].get_offsets(), [[0.15, 97.0]])
    prefix = panels["timeline-prefix"].figure.axes[0].collections[0]
    assert np.allclose(prefix.get_offsets(), [[0.05, 5 / 20]])  # both sent at 0
    assert prefix.get_urls() == ["0.05 s: hit rate 0.25"]
    assert plots.timeline(_run()) == []


def test_session_waterfall_draws_each_requests_wait_and_decode():
    requests = [
        _request("a0", "a", 0, [10, 30]),
        _request("a1", "a", 50, [55, 70]),
        _request("b0", "b", 5, [20, 25], error="boom"),
        _request("b1", "b", 40, [45]),
    ]
    plot = plots.session_waterfall(_run(requests=requests))
    ax = plot.figure.axes[0]
    spans = [(round(b.get_x(), 3), round(b.get_width(), 3), b.get_y() + 0.35) for b in ax.patches]
    assert spans == [
        (0.0, 0.01, 0), (0.01, 0.02, 0), (0.05, 0.005, 0), (0.055, 0.015, 0),  # session a
        (0.005, 0.015, 1), (0.02, 0.005, 1), (0.04, 0.005, 1), (0.045, 0.0, 1),  # session b
    ]  # fmt: skip
    assert to_hex(ax.patches[5].get_facecolor()) == RED.lower()  # b0 failed
    assert ax.patches[0].get_url() == "a0: first token 10.0 ms"
    assert ax.patches[1].get_url() == "a0: 2 tokens in 20.0 ms"
    assert [t.get_text() for t in ax.get_yticklabels()] == ["a", "b"]
    assert ax.get_ylim() == (1.5, -0.5)  # the first session on top
    assert [t.get_text() for t in ax.get_legend().get_texts()][-1] == "failed request"
    one_each = [_request("x", "x", 0, [1]), _request("y", "y", 0, [1])]
    assert plots.session_waterfall(_run(requests=one_each)) is None  # no session has a gap


def test_sweep_curves_plot_latency_against_throughput():
    def point(load: float, tok_per_s: float, p50: float, p99: float | None) -> RunData:
        latency = {"p50": p50, "p99": p99}
        summary = {"output_tok_per_s": tok_per_s, "ttft_ms": latency, "tpot_ms": latency}
        run = _run(summary=summary)
        run.results["sweep_point"] = load
        return run

    curves = plots.sweep_curves([point(1, 100.0, 10.0, 20.0), point(2, 180.0, 15.0, None)])
    assert [c.key for c in curves] == ["sweep-ttft_ms", "sweep-tpot_ms"]
    ax = curves[0].figure.axes[0]
    p50, p99 = ax.lines
    assert np.asarray(p50.get_xydata()).tolist() == [[100.0, 10.0], [180.0, 15.0]]
    assert np.asarray(p99.get_xydata()).tolist() == [[100.0, 20.0]]  # unknown p99: no point
    assert [t.get_text() for t in ax.texts] == ["1", "2"]  # the loads, at the p50 points
    assert ax.collections[0].get_urls() == ["100.0 tok/s: p50 10.0 ms", "180.0 tok/s: p50 15.0 ms"]
    assert plots.sweep_curves([point(1, 1.0, 1.0, 1.0)]) == []
