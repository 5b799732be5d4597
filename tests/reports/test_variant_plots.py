"""The variants' figures: one bar per variant, one CDF curve per variant, speed vs quality only
when a variant measured quality."""

from __future__ import annotations

import dataclasses

from llmbench.reports import variant_plots, variant_tables
from tests.reports.variant_folders import write_variants


def test_figures_draw_each_measured_variant(tmp_path):
    _, runs = variant_tables.load(write_variants(tmp_path))
    plots = variant_plots.figures(runs)
    assert [p.key for p in plots] == [
        "variants-speed",
        "variants-ttft-cdf",
        "variants-tpot-cdf",
        "variants-speed-quality",
    ]
    speed = plots[0].figure
    throughput, tpot = speed.axes
    # One bar per measured variant (the failed one has none), the first on top.
    assert [t.get_text() for t in throughput.get_yticklabels()] == ["fast", "slow"]
    bars = throughput.patches
    assert len(bars) == 2 and len(tpot.patches) == 2
    fast, slow = (v.run.summary for v in variant_tables.measured(runs))
    assert bars[0].get_width() == fast["output_tok_per_s"]
    assert bars[1].get_width() == slow["output_tok_per_s"]
    assert tpot.patches[1].get_width() == slow["tpot_ms"]["p50"]
    cdf = plots[2].figure.axes[0]
    assert [t.get_text() for t in cdf.get_legend().get_texts()] == ["fast", "slow"]
    quality = plots[3].figure.axes[0]
    # The unquantised perplexity as a line, the slow variant (the one with quality) a marker.
    assert quality.lines[0].get_ydata()[0] == 12.0
    assert quality.collections[0].get_offsets().tolist() == [[slow["output_tok_per_s"], 12.5]]


def test_no_measured_variant_no_figures(tmp_path):
    _, runs = variant_tables.load(write_variants(tmp_path))
    broken = [dataclasses.replace(v, run=None) for v in runs]
    assert variant_plots.figures(broken) == []
