"""Tests for llmbench.engine.draft_budget: which drafts a step keeps, and what the budget
learns from the steps and verifies it is told about (hand-computed values)."""

from __future__ import annotations

import pytest
import torch

from llmbench.engine.draft_budget import EXPLORE_EVERY, DraftBudget, drafts_to_keep
from llmbench.engine.sampling import SamplingParams
from llmbench.engine.sequence import Sequence


@pytest.mark.parametrize(
    ("num_drafts", "rates", "verify_s", "draft_row_s", "expected"),
    [
        # The docstring's example: tokens per ms 0.200, 0.193, 0.186, 0.168, 0.149 for n = 0 … 4.
        ([2, 2], [0.9, 0.5], 0.0, 5e-3, [0, 0]),
        # 0.200, 0.242, 0.265, 0.263, 0.248: the first two drafts by worth, both the first's.
        ([2, 2], [0.9, 0.5], 0.0, 2e-3, [2, 0]),
        # 0.200, 0.264, 0.309, 0.324, 0.319: the second sequence's first draft (0.5) too.
        ([2, 2], [0.9, 0.5], 0.0, 1e-3, [2, 1]),
        # A verify step's own 4 ms: 0.200, 0.181, 0.206, 0.211, 0.203 (one draft alone does not
        # pay for it, three do).
        ([2, 2], [0.9, 0.5], 4e-3, 2e-3, [2, 1]),
        # Free rows: every draft with any chance is worth it; a sure-to-fail one never is.
        ([3, 4], [0.2, 0.0], 0.0, 0.0, [3, 0]),
        ([], [], 0.0, 1e-3, []),
    ],
)
def test_drafts_to_keep(num_drafts, rates, verify_s, draft_row_s, expected):
    assert drafts_to_keep(num_drafts, rates, 10e-3, verify_s, draft_row_s) == expected


def test_a_draft_worth_exactly_its_cost_is_withheld():
    """1 token / 0.5 s = (1 + 0.5) tokens / 0.75 s: a tie keeps the fewest drafts."""
    assert drafts_to_keep([1], [0.5], 0.5, 0.0, 0.25) == [0]


def a_sequence(drafts: list[int], probs: torch.Tensor | None = None) -> Sequence:
    seq = Sequence("r", [1, 2, 3], SamplingParams(max_tokens=16), None, None, None, 0)
    seq.spec_token_ids, seq.spec_probs = list(drafts), probs
    return seq


def test_the_step_costs_are_running_averages_per_number_of_sequences():
    budget = DraftBudget()
    budget.observe_step(2, 4, 0.050)  # no decode time for 2 yet: nothing to add it to
    assert budget.step_cost(2) is None
    assert budget.trim([a_sequence([7, 7]), a_sequence([7])]) == 0  # not learnt: all kept
    budget.observe_step(2, 0, 0.010)
    budget.observe_step(2, 0, 0.020)  # t0: 0.010 + 0.1 · (0.020 − 0.010)
    budget.observe_step(2, 4, 0.031)  # adds 0.020 with 4 drafts: one point, a line through 0
    assert budget.step_cost(2) == pytest.approx((0.011, 0.0, 0.005))
    assert budget.step_cost(3) is None  # 3 sequences: their own averages
    # A second point, 2 drafts adding 0.013: averages x 3.8, y 0.0193, x² 14.8, x·y 0.0746;
    # c = (0.0746 − 3.8 · 0.0193) / (14.8 − 3.8²) = 0.0035, f = 0.0193 − 3.8 · 0.0035 = 0.006.
    budget.observe_step(2, 2, 0.024)
    assert budget.step_cost(2) == pytest.approx((0.011, 0.006, 0.0035))


def test_a_line_never_costs_less_than_nothing():
    budget = DraftBudget()
    budget.observe_step(1, 0, 0.010)
    budget.observe_step(1, 1, 0.030)  # 1 draft adds 0.020,
    budget.observe_step(1, 4, 0.020)  # 4 add 0.010: a falling line, so flat at their average
    assert budget.step_cost(1) == pytest.approx((0.010, 0.019, 0.0))
    budget = DraftBudget()
    budget.observe_step(1, 0, 0.010)
    budget.observe_step(1, 1, 0.011)  # 1 draft adds 0.001,
    budget.observe_step(1, 4, 0.030)  # 4 add 0.020: f < 0, so a line through 0
    # c = x·y / x² = (0.001 + 0.1 · (0.080 − 0.001)) / (1 + 0.1 · (16 − 1)) = 0.0089 / 2.5
    assert budget.step_cost(1) == pytest.approx((0.010, 0.0, 0.0089 / 2.5))


def test_acceptance_rates_start_at_the_runs_and_follow_the_sequence():
    budget = DraftBudget()
    seq, other = a_sequence([]), a_sequence([])
    assert budget.rate(seq) == pytest.approx(0.5)  # nothing seen: (0 + 1) / (0 + 0 + 2)
    seq.num_accepted_tokens += 4  # the engine counts accepted drafts on the sequence
    budget.observe_verify(seq, 4, 4)
    seq.num_accepted_tokens += 1
    budget.observe_verify(seq, 4, 1)  # a rejection
    assert (seq.num_draft_rejections, other.num_draft_rejections) == (1, 0)
    run = (5 + 1) / (5 + 1 + 2)  # 0.75
    assert budget.rate(other) == pytest.approx(run)
    assert budget.rate(seq) == pytest.approx((5 + 4 * run) / (5 + 1 + 4))  # 0.8


def test_trim_cuts_proposals_and_their_probabilities_and_relearns_every_few_steps():
    budget = DraftBudget()
    budget.observe_step(2, 0, 0.010)
    budget.observe_step(2, 1, 0.014)  # one point: 4 ms a draft row, no verify step's own
    budget.observe_verify(a_sequence([]), 9, 9)  # the run's rate: (9 + 1) / (9 + 0 + 2) = 10/11
    probs = torch.rand(3, 5)
    seqs = [a_sequence([4, 5, 6], probs), a_sequence([8, 9])]
    # Both sequences at the run's rate, r = 10/11: worths r, r (one each), r², r², r³; tokens
    # per ms (2 + Σ) / (10 + 4n) for n = 0 … 5: 0.200, 0.208, 0.212, 0.211, 0.210, 0.207.
    assert budget.trim(seqs) == 3
    assert seqs[0].spec_token_ids == [4] and torch.equal(seqs[0].spec_probs, probs[:1])
    assert seqs[1].spec_token_ids == [8]
    for _ in range(EXPLORE_EVERY - 2):  # asked 2 … 7 times: trimmed each time
        assert budget.trim([a_sequence([4, 5, 6]), a_sequence([8, 9])]) == 3
    relearn = [a_sequence([4, 5, 6]), a_sequence([8, 9])]
    assert budget.trim(relearn) == 0  # the 8th: every draft runs
    assert [s.spec_token_ids for s in relearn] == [[4, 5, 6], [8, 9]]
