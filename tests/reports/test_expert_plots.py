"""The mixture-of-experts figures against hand-made routing, and a real MoE run's report opened
offline in Chromium."""

from __future__ import annotations

import re
from dataclasses import fields
from pathlib import Path

import numpy as np
import pytest
from matplotlib.collections import PolyCollection
from matplotlib.image import AxesImage

from llmbench.reports import expert_plots, tables
from llmbench.reports.rundata import RunData
from llmbench.roofline.cost_model import expected_experts_touched
from tests.harness.test_run import SMALL, llmbench
from tests.reports.browser import open_in_chromium

S = 1_000_000_000

# 2 layers, 3 experts, top-2: prefill routed 6 tokens per layer (12 slots).
EXPERTS = {
    "num_layers": 2,
    "num_experts": 3,
    "top_k": 2,
    "phases": {
        "prefill": {
            "tokens": [[6, 0, 6], [2, 4, 6]],
            "weight": [[4.0, 0.0, 2.0], [1.0, 2.0, 3.0]],
            "coactivation": [[[6, 0, 6], [0, 0, 0], [6, 0, 6]], [[2, 0, 2], [0, 4, 4], [2, 4, 6]]],
        },
        "decode": {"tokens": [[0, 0, 0], [0, 0, 0]], "weight": [[0.0] * 3] * 2},
    },
    "repetitions": [],
}


def _run(steps=(), experts=None, summary=None) -> RunData:
    given = {
        "folder": Path("."),
        "results": {"summary": summary or {}, "provenance": {}, "roofline": None, "spec": {}},
        "requests": [],
        "steps": list(steps),
        "sessions": [],
        "telemetry": [],
        "experts": experts,
    }
    return RunData(**{f.name: given.get(f.name) for f in fields(RunData)})


def _step(t_s: float, phase: str, batch: int, touched=(), load=None, repetition=1) -> dict:
    return {
        "t_start_ns": int(t_s * S),
        "t_end_ns": int((t_s + 0.01) * S),
        "phase": phase,
        "num_seqs": batch,
        "context_lens": [10] * batch,
        "query_lens": [1] * batch,
        "experts_touched": list(touched),
        "expert_load_max_over_mean": load,
        "repetition": repetition,
    }


def test_heatmap_cells_are_the_tokens_routed_with_their_shares():
    plot = expert_plots.expert_heatmap(_run(experts=EXPERTS), "prefill")
    assert plot.key == "experts-prefill"
    ax = plot.figure.axes[0]
    (cells,) = [c for c in ax.collections if isinstance(c, PolyCollection)]
    assert cells.get_array().tolist() == [6, 0, 6, 2, 4, 6]  # layer 0's experts, then layer 1's
    assert cells.get_urls()[4] == (
        "layer 1, expert 1: 4 tokens (33.3% of the layer's), 33.3% of its routing weight"
    )
    assert ax.get_ylim() == (1.5, -0.5)  # layer 0 on top
    assert "6 prefill tokens" in plot.caption and "layer 0, expert 0 with 50.0%" in plot.caption
    # The decode phase routed nothing; a dense run has no experts at all.
    assert expert_plots.expert_heatmap(_run(experts=EXPERTS), "decode") is None
    assert expert_plots.expert_heatmap(_run(), "prefill") is None


def test_a_big_heatmap_is_one_image_without_hover_texts():
    num_layers, num_experts = 48, 128  # Qwen3-30B-A3B: 6,144 cells
    tokens = np.arange(num_layers * num_experts).reshape(num_layers, num_experts).tolist()
    big = {
        "num_layers": num_layers,
        "num_experts": num_experts,
        "top_k": 8,
        "phases": {"prefill": {"tokens": tokens, "weight": tokens}},
    }
    plot = expert_plots.expert_heatmap(_run(experts=big), "prefill")
    ax = plot.figure.axes[0]
    assert [type(i) for i in ax.images] == [AxesImage]
    assert not [c for c in ax.collections if isinstance(c, PolyCollection)]
    assert "6,144 cells: drawn as an image" in plot.caption


def test_load_imbalance_points_by_phase_with_the_even_and_one_token_lines():
    steps = [
        _step(0.0, "decode", 1, load=4.0, repetition=0),  # warm-up: left out
        _step(1.0, "prefill", 1, load=1.5),
        _step(2.0, "decode", 1, load=1.5),
        _step(3.0, "decode", 2, load=3.0),
        _step(4.0, "decode", 1),  # a dense step: no load
    ]
    experts = {**EXPERTS, "num_experts": 8, "top_k": 2}
    plot = expert_plots.expert_load(_run(steps, experts))
    ax = plot.figure.axes[0]
    decode, prefill = ax.collections
    # x: each step's end, from the run's start (no requests: its first step, at 0 s).
    assert np.allclose(decode.get_offsets(), [[2.01, 1.5], [3.01, 3.0]])
    assert np.allclose(prefill.get_offsets(), [[1.01, 1.5]])
    # Numbered as in steps.jsonl (0-based), as the roofline's hover texts are.
    assert decode.get_urls()[1] == "decode step 3: 2 sequences, 2 tokens, max/mean 3.00"
    assert sorted(line.get_ydata()[0] for line in ax.lines) == [1.0, 4.0]  # even, E/k = 8/2
    assert "p50 1.50" in plot.caption and "over 3 steps" in plot.caption
    assert expert_plots.expert_load(_run([_step(1.0, "decode", 1)])) is None


def test_experts_touched_against_the_uniform_expectation():
    experts = {**EXPERTS, "num_experts": 8, "top_k": 2}
    steps = [
        _step(1.0, "decode", 1, touched=(2, 2)),
        _step(2.0, "decode", 4, touched=(3, 5)),
        _step(3.0, "decode", 4, touched=(4, 4)),
        _step(4.0, "prefill", 4, touched=(8, 8)),  # prefill: not a decode step
    ]
    plot = expert_plots.experts_touched(_run(steps, experts))
    ax = plot.figure.axes[0]
    (marks,) = ax.collections
    assert marks.get_offsets().tolist() == [[1, 2.0], [4, 4.0]]  # mean per batch size
    assert marks.get_urls()[1] == (
        "batch 4: 2 decode steps, 4.00 experts per layer (uniform: 5.47)"
    )
    curve = ax.lines[0]
    assert curve.get_xdata().tolist() == list(range(1, 9))
    assert curve.get_ydata() == pytest.approx(
        [expected_experts_touched(8, 2, b) for b in range(1, 9)]
    )
    assert expert_plots.experts_touched(_run([_step(1.0, "decode", 1)])) is None


def test_a_dense_run_has_no_expert_figures_or_rows():
    dense = _run([_step(1.0, "decode", 1)])
    assert expert_plots.figures(dense) == []
    assert tables.expert_rows(dense) == []


def test_expert_rows():
    summary = {"moe_decode_experts_touched": 2.5, "moe_load_max_over_mean": 1.25}
    assert tables.expert_rows(_run(experts=EXPERTS, summary=summary)) == [
        ("experts", "3 per layer, top-2, 2 layers"),
        ("prefill tokens routed", "6 (per layer)"),
        ("decode tokens routed", "0 (per layer)"),
        ("experts a decode step reads", "2.50 of 3 per layer (mean over decode steps)"),
        ("load imbalance", "1.25 max / mean tokens per expert (mean over steps; 1 = even)"),
    ]


@pytest.fixture(scope="module")
def moe_report(tmp_path_factory) -> Path:
    """A real run of the tiny MoE model (8 experts, top-2): its folder."""
    out = tmp_path_factory.mktemp("moe-report") / "run"
    model = ["--set", "model=synthetic:tiny-moe", "--set", "dtype=float32"]
    result = llmbench(
        "run", "chat", *model, "--set", "warmup_requests=1", *SMALL["chat"], "--out", str(out)
    )
    assert result.returncode == 0, result.stderr
    return out


# The hover text Chromium finds under the centre of the first uncovered mark of each MoE figure.
HOVER_JS = """(() => ['experts-prefill', 'experts-decode', 'expert-load', 'experts-touched']
  .map(id => {
    const figure = document.getElementById(id);
    if (!figure) return [id, null];
    for (const tip of figure.querySelectorAll('.tip')) {
      tip.scrollIntoView({block: 'center', inline: 'center'});
      const box = tip.getBoundingClientRect();
      const hit = document.elementFromPoint(box.left + box.width / 2, box.top + box.height / 2);
      if (hit && hit.closest('.tip') === tip) return [id, tip.querySelector('title').textContent];
    }
    return [id, ''];
  }))()"""


def test_a_moe_runs_report_shows_its_routing_offline(moe_report, tmp_path):
    """experts.json drawn into report.html: the heatmaps per phase, the load imbalance and the
    experts a decode step reads, each hoverable, in headless Chromium with the network off."""
    html = (moe_report / "report.html").read_text()
    assert "<h2>Mixture of experts</h2>" in html
    assert "8 per layer, top-2, 2 layers" in html
    assert "## Mixture of experts" in (moe_report / "report.md").read_text()
    keys = ("experts-prefill", "experts-decode", "expert-load", "experts-touched")
    selector = ", ".join(f"#{key} > svg" for key in keys)
    page = open_in_chromium(
        moe_report / "report.html", selector, tmp_path / "moe.png", expression=HOVER_JS
    )
    assert page.console_errors == [] and page.requests == []
    assert len(page.element_sizes) == len(keys)  # each figure an inline SVG, laid out
    for name, width, height in page.element_sizes:
        assert width > 300 and height > 100, name
    hovered = dict(page.evaluated)
    assert re.fullmatch(
        r"layer \d, expert \d: [\d,]+ tokens \([\d.]+% of the layer's\), [\d.]+% of its "
        r"routing weight",
        hovered["experts-prefill"],
    )
    assert re.fullmatch(
        r"(decode|prefill|mixed) step \d+: \d+ sequences, \d+ tokens, max/mean [\d.]+",
        hovered["expert-load"],
    )
    assert re.fullmatch(
        r"batch \d+: \d+ decode steps, [\d.]+ experts per layer \(uniform: [\d.]+\)",
        hovered["experts-touched"],
    )
    for key in keys:
        assert (moe_report / "figures" / f"{key}.png").is_file()
