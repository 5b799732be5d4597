"""`llmbench roofline`: what-if bounds from a model's shapes and a device's roofs."""

from __future__ import annotations

import json

import pytest

from tests.cli.helpers import assert_user_error, llmbench


def test_roofline_what_if_without_weights(tmp_path):
    html = tmp_path / "whatif.html"
    result = llmbench(
        "roofline",
        "--model",
        "synthetic:llama-3.1-8b",
        "--hardware",
        "h100",
        "--batch",
        "1,64",
        "--context",
        "1k",
        "--json",
        "--html",
        str(html),
    )
    assert result.returncode == 0, result.stderr
    points = json.loads(result.stdout)["points"]
    # The plots: a point per (context, batch) on the roofline, curves against the batch.
    page = html.read_text()
    for key in ("whatif-roofline", "whatif-decode_tok_per_s", "whatif-tpot_ms_bound"):
        assert f'<figure id="{key}">' in page
    start = page.index('<figure id="whatif-roofline">')
    roofline = page[start : page.index("</figure>", start)]
    assert roofline.count('class="tip"') == 2  # a point with its hover text per step
    assert [(p["context"], p["batch"]) for p in points] == [(1024, 1), (1024, 64)]
    one = points[0]
    # Batch 1 is memory-bound: ~15 GB of bf16 weights (the untied embedding gathers one row)
    # plus 1,024 tokens x 128 KiB of KV, at the datasheet's 3.35 TB/s.
    assert one["bound"] == "memory"
    assert one["decode_step_ms"] == pytest.approx(one["bytes_per_step"] / 3.35e12 * 1e3)
    assert 4.4 < one["decode_step_ms"] < 4.6
    assert one["kv_bytes_per_seq"] == 1024 * 2 * 32 * 8 * 128 * 2
    assert points[1]["decode_tok_per_s"] > 30 * one["decode_tok_per_s"]  # batching amortises


def test_roofline_on_the_measured_roofs_of_this_machine():
    from llmbench.harness import hardware

    result = llmbench(
        "roofline", "-m", "smollm2-135m", "--hardware", "measured", "--batch", "1", "--json"
    )
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    measured = hardware.ceilings("cpu")  # the cache the command filled or read
    assert out["peak_bytes_per_s"] == measured["read_bytes_per_s"]
    assert out["peak_flops_per_s"] == measured["matmul_flops_per_s"]["bfloat16"]
    assert out["hardware"].startswith("measured")


def test_roofline_unknown_hardware_is_one_line():
    assert_user_error(
        llmbench("roofline", "--model", "tiny", "--hardware", "abacus"), "unknown hardware 'abacus'"
    )
