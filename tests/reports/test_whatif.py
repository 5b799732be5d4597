"""The what-if page: its figures plot the predicted points, and it is written with its PNGs."""

from __future__ import annotations

import numpy as np

from llmbench.reports import whatif

# Two decode batches at one context on a 1 TB/s, 100 TFLOP/s device (ridge: 100 FLOP/B).
RESULT = {
    "model": "m",
    "hardware": "hw",
    "dtype": "bfloat16",
    "kv_dtype": "bfloat16",
    "tp": 1,
    "peak_bytes_per_s": 1e12,
    "peak_flops_per_s": 1e14,
    "points": [
        {
            "context": 1024,
            "batch": batch,
            "decode_step_ms": step_ms,
            "bound": "memory",
            "decode_tok_per_s": batch / step_ms * 1e3,
            "tpot_ms_bound": step_ms,
            "ttft_ms_bound": 50.0,
            "arithmetic_intensity": flops / num_bytes,
            "bytes_per_step": num_bytes,
            "flops_per_step": flops,
            "ridge_batch": None,
        }
        for batch, step_ms, flops, num_bytes in ((1, 2.0, 2e9, 2e9), (64, 4.0, 128e9, 4e9))
    ],
}


def test_roofline_places_each_point_at_its_intensity_and_attainable_flops():
    ax = whatif.roofline(RESULT).figure.axes[0]
    assert (ax.get_xscale(), ax.get_yscale()) == ("log", "log")
    # 2e9 FLOP in 2 ms = 1 TFLOP/s at 1 FLOP/B; 128e9 in 4 ms = 32 TFLOP/s at 32 FLOP/B.
    points = ax.collections[-1]
    assert np.allclose(points.get_offsets(), [[1.0, 1e12], [32.0, 32e12]])
    assert (
        points.get_urls()[1] == "context 1024, batch 64: 4 ms per step, 16,000 tok/s, memory-bound"
    )
    (roof,) = ax.lines
    assert roof.get_xdata().tolist() == [1.0, 100.0, 1000.0]  # ridge 100, 4x it in the range
    assert roof.get_ydata().tolist() == [1e12, 1e14, 1e14]
    assert [t.get_text() for t in ax.texts] == ["ridge 100 FLOP/B", "B=1", "B=64"]


def test_curves_against_batch():
    ax = whatif.against_batch(RESULT, "tpot_ms_bound", "TPOT bound", "ms per token").figure.axes[0]
    assert np.asarray(ax.lines[0].get_xydata()).tolist() == [[1, 2.0], [64, 4.0]]
    assert ax.get_xscale() == "log"


def test_page_has_three_figures_a_table_and_pngs(tmp_path):
    page = whatif.render(RESULT)
    keys = ["whatif-roofline", "whatif-decode_tok_per_s", "whatif-tpot_ms_bound"]
    assert [p.key for p in page.plots] == keys
    assert all(f'<figure id="{k}">' in page.html for k in keys)
    assert "<td>16,000</td>" in page.html  # batch 64's tokens/s in the table
    page.write(tmp_path / "whatif.html")
    assert sorted(p.name for p in (tmp_path / "figures").iterdir()) == sorted(
        f"{k}.png" for k in keys
    )


def test_a_moe_pages_table_and_hover_texts_give_the_experts_touched():
    moe = {
        **RESULT,
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "points": [
            {**p, "experts_touched_per_layer": touched}
            for p, touched in zip(RESULT["points"], (2.0, 8.0), strict=True)
        ],
    }
    points = whatif.roofline(moe).figure.axes[0].collections[-1]
    assert points.get_urls()[0].endswith("memory-bound, 2 experts per layer")
    page = whatif.render(moe)
    assert "<th>experts / layer</th>" in page.html and "<td>8.00</td>" in page.html
    assert "8 experts per layer, top-2" in page.html
    assert "<th>experts / layer</th>" not in whatif.render(RESULT).html  # dense: no column
