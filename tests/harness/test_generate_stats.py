"""The numbers `llmbench generate` prints after the text, by hand."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from llmbench.engine.presets import PRESETS
from llmbench.harness.generate_stats import (
    decode_bytes_per_s,
    decode_tok_per_s,
    format_summary,
    link_line,
)
from llmbench.roofline.cost_model import StepShape, step_cost


def _step(duration_ns: int, context: int, query: int) -> SimpleNamespace:
    return SimpleNamespace(
        t_start_ns=0,
        t_end_ns=duration_ns,
        context_lens=(context,),
        query_lens=(query,),
        num_prefill_tokens=query if query > 1 else 0,
        num_decode_seqs=1 if query == 1 else 0,
    )


def test_decode_bandwidth_is_the_cost_models_bytes_over_decode_time():
    config = PRESETS["tiny"]
    # A prefill (ignored), then decodes at contexts 6 and 7 taking 1 ms and 3 ms.
    steps = [_step(5_000_000, 5, 5), _step(1_000_000, 6, 1), _step(3_000_000, 7, 1)]
    cost = [
        step_cost(
            config,
            StepShape(decode_context_lens=(c,), weight_bytes_per_param=2, kv_bytes_per_elem=2),
        ).bytes
        for c in (6, 7)
    ]
    assert decode_bytes_per_s(config, steps, 2) == pytest.approx(sum(cost) / 4e-3)
    assert decode_bytes_per_s(config, steps[:1], 2) is None  # no decode step


def test_decode_tokens_per_second_and_the_summary_line():
    token_ns = [0, 10_000_000, 20_000_000, 40_000_000]  # 3 gaps over 40 ms
    assert decode_tok_per_s(token_ns) == pytest.approx(75.0)
    assert decode_tok_per_s([5]) == 0.0
    line = format_summary(12, 3.26, token_ns, 2.5e9)
    assert line == (
        "prompt=12 tok, prefill=3.3 ms, output=4 tok, decode=75.0 tok/s, achieved=2.50 GB/s"
    )
    assert format_summary(12, 3.26, token_ns, None).endswith("achieved=- GB/s")


def test_link_line_totals_the_steps():
    class Step:
        def __init__(self, link_bytes, link_s_simulated):
            self.link_bytes, self.link_s_simulated = link_bytes, link_s_simulated

    steps = [Step(2**20, 0.001), Step(0, 0.0), Step(2**20, 0.002)]
    assert link_line(steps) == "link 2.00 MiB in 2 of 3 steps, 3 ms simulated"
