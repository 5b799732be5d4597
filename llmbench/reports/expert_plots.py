"""The mixture-of-experts figures of a run's report, from experts.json and steps.jsonl alone
(None: a dense model, or no data): tokens routed per layer and expert, the load imbalance of
each step, and the experts a decode step reaches against its batch.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from matplotlib.collections import PolyCollection
from matplotlib.ticker import MaxNLocator

from llmbench.reports.figure import BLUE, GREY, RED, Plot, hover, new_axes, styled
from llmbench.reports.plots import MAX_POINTS, PHASE_COLOURS, WIDE_IN
from llmbench.reports.rundata import RunData
from llmbench.roofline.cost_model import expected_experts_touched

# Cells of a heatmap that get their own hover text; a bigger one (Qwen3-30B-A3B: 48 × 128) is
# drawn as one image, its numbers in the caption, so the page stays small.
MAX_HOVER_CELLS = 4096
HEATMAP_CMAP = "viridis"


def _measured_steps(run: RunData) -> list[tuple[int, dict[str, Any]]]:
    """(index in steps.jsonl, step) of the engine steps of the measured repetitions (the
    warm-up's left out), in time order."""
    return [
        (i, s)
        for i, s in enumerate(run.steps)
        if s.get("repetition", 1) >= 1 and "context_lens" in s
    ]


@styled
def expert_heatmap(run: RunData, phase: str) -> Plot | None:
    """Tokens routed to each expert of each layer in one phase (`prefill` or `decode`), pooled
    over the measured repetitions; hovering a cell gives its count, its share of the layer's
    routed tokens and of its routing weight."""
    stats = ((run.experts or {}).get("phases") or {}).get(phase)
    if not stats:
        return None
    tokens = np.array(stats["tokens"], dtype=float)  # [L, E]
    if tokens.ndim != 2 or not tokens.sum():
        return None
    weight = np.array(stats.get("weight") or np.zeros_like(tokens), dtype=float)
    num_layers, num_experts = tokens.shape
    width_in = min(12.0, max(4.5, 1.6 + 0.28 * num_experts))
    height_in = min(9.0, max(2.6, 1.1 + 0.22 * num_layers))
    figure, ax = new_axes(
        (width_in, height_in), f"Tokens routed per expert ({phase})", "expert", "layer"
    )
    ax.grid(False)
    per_layer = tokens.sum(axis=1, keepdims=True)
    share = np.divide(tokens, per_layer, out=np.zeros_like(tokens), where=per_layer > 0)
    weight_total = weight.sum(axis=1, keepdims=True)
    weight_share = np.divide(
        weight, weight_total, out=np.zeros_like(weight), where=weight_total > 0
    )
    if tokens.size <= MAX_HOVER_CELLS:
        cells = [
            [(e - 0.5, y - 0.5), (e + 0.5, y - 0.5), (e + 0.5, y + 0.5), (e - 0.5, y + 0.5)]
            for y in range(num_layers)
            for e in range(num_experts)
        ]
        mesh = PolyCollection(cells, array=tokens.ravel(), cmap=HEATMAP_CMAP, edgecolors="face")
        ax.add_collection(mesh)
        hover(
            mesh,
            [
                f"layer {y}, expert {e}: {tokens[y, e]:,.0f} tokens ({share[y, e]:.1%} of the "
                f"layer's), {weight_share[y, e]:.1%} of its routing weight"
                for y in range(num_layers)
                for e in range(num_experts)
            ],
        )
    else:
        mesh = ax.imshow(tokens, cmap=HEATMAP_CMAP, aspect="auto", interpolation="nearest")
    ax.set(xlim=(-0.5, num_experts - 0.5), ylim=(num_layers - 0.5, -0.5))  # layer 0 on top
    step = max(1, math.ceil(num_experts / 32))
    ax.set_xticks(range(0, num_experts, step))
    ax.set_yticks(range(0, num_layers, max(1, math.ceil(num_layers / 24))))
    figure.colorbar(mesh, ax=ax, label="tokens routed", shrink=0.9)
    k = run.experts.get("top_k") or 1
    busiest = np.unravel_index(np.argmax(share), share.shape)
    caption = (
        f"{per_layer.max() / k:,.0f} {phase} tokens over the measured repetitions, each routed "
        f"to {k} experts per layer. Even routing would give every expert "
        f"{1 / num_experts:.1%} of a layer's; the busiest cell is layer {busiest[0]}, expert "
        f"{busiest[1]} with {share[busiest]:.1%}."
    )
    if tokens.size > MAX_HOVER_CELLS:
        caption += f" ({tokens.size:,} cells: drawn as an image, without hover texts.)"
    return Plot(f"experts-{phase}", figure, caption)


@styled
def expert_load(run: RunData) -> Plot | None:
    """Each step's load imbalance (max tokens on one expert / mean per expert) over time,
    coloured by phase, with the even load (1) and the most uneven (E / k: every token on the
    same k experts)."""
    steps = [
        (i, s) for i, s in _measured_steps(run) if s.get("expert_load_max_over_mean") is not None
    ]
    if not steps:
        return None
    stride = max(1, math.ceil(len(steps) / MAX_POINTS))
    shown = steps[::stride]
    figure, ax = new_axes((WIDE_IN, 2.8), "Expert load imbalance", "time (s)", "max / mean tokens")
    t0 = run.t0_ns
    for phase, colour in PHASE_COLOURS.items():
        own = [(i, s) for i, s in shown if s["phase"] == phase]
        if not own:
            continue
        xs = [(s["t_end_ns"] - t0) / 1e9 for _, s in own]
        ys = [s["expert_load_max_over_mean"] for _, s in own]
        marks = ax.scatter(xs, ys, s=12, color=colour, alpha=0.7, label=f"{phase} steps")
        hover(
            marks,
            [
                f"{phase} step {i}: {s.get('num_seqs', 1)} sequences, "
                f"{sum(s.get('query_lens') or [0])} tokens, max/mean {y:.2f}"
                for (i, s), y in zip(own, ys, strict=True)
            ],
        )
    ax.axhline(1.0, color=GREY, linestyle="--", lw=1, label="even (1)")
    values = np.array([s["expert_load_max_over_mean"] for _, s in steps])
    top = float(values.max())
    experts = run.experts or {}
    if experts.get("num_experts") and experts.get("top_k"):
        ceiling = experts["num_experts"] / experts["top_k"]
        ax.axhline(
            ceiling, color=RED, linestyle=":", lw=1, label=f"one token's (E/k = {ceiling:g})"
        )
        top = max(top, ceiling)
    ax.set_ylim(0, 1.08 * max(top, 1.0))
    handles = ax.get_legend_handles_labels()[0]  # one row above the plot, right of the title
    ax.legend(loc="lower right", bbox_to_anchor=(1, 1), ncols=len(handles), frameon=False)
    p50, p99 = np.percentile(values, [50, 99])
    caption = (
        f"Per step, the most tokens any expert got over the mean per expert (the engine's "
        f"expert_load_max_over_mean): p50 {p50:.2f}, p99 {p99:.2f} over {len(steps)} steps. "
        "A few tokens cannot spread evenly: a single token sits at E/k."
    )
    if stride > 1:
        caption += f" Every {stride}th step is drawn."
    return Plot("expert-load", figure, caption)


@styled
def experts_touched(run: RunData) -> Plot | None:
    """Distinct experts a decode step reached per layer against its batch: the engine's count
    (mean per batch size) and the uniform-routing expectation E·(1 − (1 − k/E)^B)."""
    by_batch: dict[int, list[float]] = {}
    for _, s in _measured_steps(run):
        touched = s.get("experts_touched")
        if s["phase"] == "decode" and touched:
            by_batch.setdefault(len(s["context_lens"]), []).append(sum(touched) / len(touched))
    if not by_batch:
        return None
    batches = sorted(by_batch)
    means = [float(np.mean(by_batch[b])) for b in batches]
    figure, ax = new_axes(
        (5.9, 3.6), "Experts a decode step reads", "decode batch (sequences)", "experts per layer"
    )
    experts = run.experts or {}
    num_experts, top_k = experts.get("num_experts"), experts.get("top_k")
    # At least batches 1 to 8, so the curve shows its bend even when the run had batch 1 only.
    grid = np.arange(1, max(8, *batches) + 1)
    if num_experts and top_k:
        expected = [expected_experts_touched(num_experts, top_k, b) for b in grid]
        ax.plot(grid, expected, color=GREY, linestyle="--", label="uniform routing (expected)")
        ax.axhline(num_experts, color=RED, linestyle=":", lw=1, label=f"all {num_experts}")
    marks = ax.scatter(batches, means, color=BLUE, s=24, zorder=3, label="engine (mean per batch)")
    texts = []
    for b, m in zip(batches, means, strict=True):
        text = f"batch {b}: {len(by_batch[b])} decode steps, {m:.2f} experts per layer"
        if num_experts and top_k:
            text += f" (uniform: {expected_experts_touched(num_experts, top_k, b):.2f})"
        texts.append(text)
    hover(marks, texts)
    ax.set(xlim=(0, grid[-1] + 1), ylim=(0, 1.05 * max([*means, num_experts or 0])))
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.legend(loc="lower right")
    caption = (
        "The routed experts' bytes of a decode step grow with the experts it reaches: the cost "
        "model counts the engine's number per step; `llmbench roofline` assumes the uniform "
        "expectation. Above the dashed curve the routing spreads wider than uniform, below it "
        "the batch's tokens share experts."
    )
    return Plot("experts-touched", figure, caption)


def figures(run: RunData) -> list[Plot]:
    """Every MoE figure the run has data for, in page order ([] for a dense model)."""
    shown = [
        expert_heatmap(run, "prefill"),
        expert_heatmap(run, "decode"),
        expert_load(run),
        experts_touched(run),
    ]
    return [p for p in shown if p is not None]
