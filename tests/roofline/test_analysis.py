"""Run analysis: engine steps costed into roofline points, and per-phase utilisation, by hand."""

from __future__ import annotations

import pytest

from llmbench.engine.presets import PRESETS
from llmbench.roofline.cost_model import StepShape, decode_cost, step_cost


def _step(t_ns: int, context_lens: tuple, query_lens: tuple, prefill: int, decode: int):
    from types import SimpleNamespace

    return SimpleNamespace(
        t_start_ns=0,
        t_end_ns=t_ns,
        context_lens=context_lens,
        query_lens=query_lens,
        num_prefill_tokens=prefill,
        num_decode_seqs=decode,
    )


def test_phase_utilization_against_step_cost():
    """Two steps by hand: a 5-token prefill and a decode, each exactly 1 ms."""
    from llmbench.roofline.analysis import cost_steps, phase_utilization

    config = PRESETS["tiny"]
    prefill = _step(1_000_000, (5,), (5,), prefill=5, decode=0)
    decode = _step(1_000_000, (6,), (1,), prefill=0, decode=1)
    points = cost_steps(config, [prefill, decode], 4, 4)
    assert [p["phase"] for p in points] == ["prefill", "decode"]
    assert [p["num_seqs"] for p in points] == [1, 1]
    assert points[0]["context_lens"] == (5,)  # the record's own fields are kept
    phases = phase_utilization(points, peak_read_bytes_per_s=1e9, peak_flops_per_s=1e10)
    expected_prefill = step_cost(
        config, StepShape(prefill=((0, 5),), weight_bytes_per_param=4, kv_bytes_per_elem=4)
    )
    expected_decode = step_cost(
        config, StepShape(decode_context_lens=(6,), weight_bytes_per_param=4, kv_bytes_per_elem=4)
    )
    assert set(phases) == {"prefill", "decode"}
    assert phases["prefill"]["flops_per_s"] == pytest.approx(expected_prefill.flops / 1e-3)
    assert phases["prefill"]["mfu"] == pytest.approx(expected_prefill.flops / 1e-3 / 1e10)
    # A decode is a 1-token chunk at the end of its context: the same cost either way.
    assert phases["decode"]["bytes_per_s"] == pytest.approx(expected_decode.bytes / 1e-3)
    assert phases["decode"]["mbu"] == pytest.approx(expected_decode.bytes / 1e-3 / 1e9)
    # Unknown roofs: achieved numbers only.
    unknown = phase_utilization(points, None, None)
    assert unknown["decode"]["mbu"] is None and unknown["decode"]["bytes_per_s"] > 0


def test_an_achieved_rate_above_its_ceiling_is_a_warning_not_a_utilisation():
    """1 GB moved and 2 GFLOP in 50 ms: 20 GB/s and 40 GFLOP/s against a 19 GB/s read roof
    and a 100 GFLOP/s peak. The bandwidth roof is wrong (MBU None, one line); MFU stands."""
    from llmbench.roofline.analysis import ceiling_warnings, phase_utilization

    point = {"phase": "decode", "t_start_ns": 0, "t_end_ns": 50_000_000, "bytes": 1e9}
    phases = phase_utilization([{**point, "flops": 2e9}], 19e9, 100e9)
    assert phases["decode"]["mbu"] is None
    assert phases["decode"]["mfu"] == pytest.approx(0.4)
    assert ceiling_warnings(phases, 19e9, 100e9) == [
        "decode bandwidth achieved 20.0 GB/s > measured ceiling 19.0 GB/s: the ceiling is "
        "stale or wrong; re-measure with `llmbench hardware --refresh`"
    ]
    assert ceiling_warnings(phases, 21e9, 100e9) == []
    assert ceiling_warnings(phases, 19e9, 100e9, "datasheet L4") == [
        "decode bandwidth estimated at 20.0 GB/s > 19.0 GB/s of the datasheet L4: the weights' "
        "bytes assumed are too many (set backend.weights) or the server is not on that hardware"
    ]
    assert ceiling_warnings(phases, None, None) == []


def test_a_step_with_prefill_and_decode_is_mixed():
    from llmbench.roofline.analysis import cost_steps, step_phase

    assert step_phase(0, 3) == "decode" and step_phase(7, 0) == "prefill"
    step = _step(1_000, (4, 9), (4, 1), prefill=4, decode=1)
    (point,) = cost_steps(PRESETS["tiny"], [step], 2, 2)
    shape = StepShape(prefill=((0, 4), (8, 1)), weight_bytes_per_param=2, kv_bytes_per_elem=2)
    assert point["phase"] == "mixed" and point["num_seqs"] == 2
    assert point["flops"] == step_cost(PRESETS["tiny"], shape).flops


def test_estimated_decode_from_client_token_times():
    """Two streams decoding side by side for 10 ms, a token each per ms: batch 2, 10 steps."""
    from types import SimpleNamespace

    from llmbench.roofline.analysis import estimate_decode_steps

    def stream(prompt: int) -> SimpleNamespace:
        # first token (the prefill's) at 0 ms, then one token every ms up to 10 ms
        return SimpleNamespace(
            ok=True,
            num_prompt_tokens=prompt,
            chunk_ns=[i * 1_000_000 for i in range(11)],
            chunk_tokens=[1] * 11,
        )

    config = PRESETS["tiny"]
    failed = SimpleNamespace(ok=False, num_prompt_tokens=5, chunk_ns=[0, 1], chunk_tokens=[1, 1])
    # The run spans 10 ms, ten inter-token gaps: one window.
    (point,) = estimate_decode_steps(config, [stream(10), stream(30), failed], 2, 2)
    assert point["is_estimated"] and point["phase"] == "decode"
    assert point["num_seqs"] == 2 and point["num_steps"] == 10  # 20 tokens / batch 2
    # Contexts: prompt + 1 (first token) + 1..10 → mean 15.5 and 35.5, so 25.5 → 26 (rounded).
    assert point["mean_context_len"] == 26
    step = decode_cost(config, 2, 26, 2, 2)
    assert point["bytes"] == pytest.approx(10 * step.bytes)
    assert point["flops"] == pytest.approx(10 * step.flops)
    assert (point["t_start_ns"], point["t_end_ns"]) == (0, 10_000_000)
    # Windows where nothing decoded give no point.
    assert estimate_decode_steps(config, [failed], 2, 2) == []


def test_estimated_windows_add_up_to_the_whole_decode():
    """One stream, a token every ms for 100 ms: 10 windows of 10 gaps each, whose bytes over
    their time is one decode step per ms, whatever window a token's step falls into."""
    from types import SimpleNamespace

    from llmbench.roofline.analysis import estimate_decode_steps, phase_utilization

    config = PRESETS["tiny"]
    one = SimpleNamespace(
        ok=True,
        num_prompt_tokens=1000,
        chunk_ns=[i * 1_000_000 for i in range(101)],
        chunk_tokens=[1] * 101,
    )
    points = estimate_decode_steps(config, [one], 2, 2)  # 100 windows asked: 10 ms is the least
    assert len(points) == 10
    assert [p["t_end_ns"] - p["t_start_ns"] for p in points] == [10_000_000] * 10
    decode = phase_utilization(points, None, None)["decode"]
    # Contexts 1001..1100 are within 10 % of each other: the bytes of the mean-context step.
    step = decode_cost(config, 1, 1050, 2, 2)
    assert decode["bytes_per_s"] == pytest.approx(step.bytes / 1e-3, rel=0.01)
    assert decode["num_steps"] == pytest.approx(100)


def test_a_speculative_step_counts_the_verified_rows_and_the_draft_models_passes():
    from types import SimpleNamespace

    from llmbench.roofline.analysis import cost_steps
    from llmbench.roofline.cost_model import DraftModel, draft_cost

    config = PRESETS["tiny"]
    passes = (((20, 1), (30, 1)), ((21, 1), (31, 1)))  # two sequences, drafts 1 and 2
    step = SimpleNamespace(
        t_start_ns=0,
        t_end_ns=1_000,
        context_lens=(22, 32),
        query_lens=(3, 3),  # each: its last token and 2 drafts
        num_prefill_tokens=0,
        num_decode_seqs=2,
        num_proposed_tokens=4,
        draft_passes=passes,
    )
    (plain,) = cost_steps(config, [step], 2, 2)
    draft_model = DraftModel(config, weight_bytes_per_param=1.0, kv_bytes_per_elem=2.0)
    (point,) = cost_steps(config, [step], 2, 2, draft=draft_model)
    verify = step_cost(
        config,
        StepShape(
            prefill=((19, 3), (29, 3)),
            weight_bytes_per_param=2,
            kv_bytes_per_elem=2,
            num_draft_tokens=4,
        ),
    )
    draft = draft_cost(draft_model, passes)
    assert (plain["flops"], plain["bytes"]) == (verify.flops, verify.bytes)
    assert "draft_flops" not in plain  # no draft model given: n-gram drafts cost nothing
    assert point["flops"] == verify.flops + draft.flops
    assert point["bytes"] == verify.bytes + draft.bytes
    assert (point["draft_flops"], point["draft_bytes"]) == (draft.flops, draft.bytes)
    assert point["phase"] == "decode"
