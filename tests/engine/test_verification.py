"""Tests for llmbench.engine.verification: greedy acceptance, and the rejection-sampling rule
keeping the target's distribution (chi-square over many seeded draws on a 5-token vocabulary)."""

from __future__ import annotations

import pytest
import torch

from llmbench.engine.sampling import SamplingParams
from llmbench.engine.scheduler import ScheduledSeq
from llmbench.engine.sequence import Sequence
from llmbench.engine.verification import accept_greedy, rejection_sample, verify

# chi-square 0.999 quantiles (scipy.stats.chi2.ppf(0.999, df)): a correct rule fails one seed
# in a thousand; the seeds are fixed, so a pass is a pass.
CHI2_999 = {3: 16.266, 4: 18.467}

P = torch.tensor(
    [
        [0.10, 0.40, 0.20, 0.25, 0.05],  # p_0: after the sequence's last token
        [0.30, 0.05, 0.05, 0.50, 0.10],  # p_1: after draft 1
        [0.20, 0.20, 0.20, 0.20, 0.20],  # p_2: the bonus token's
    ]
)
Q = torch.tensor(
    [
        [0.05, 0.10, 0.50, 0.30, 0.05],  # q_0: what draft 1 was drawn from
        [0.25, 0.25, 0.25, 0.15, 0.10],  # q_1: draft 2's
    ]
)


def chi_square(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Formula: Σ (observed - expected)² / expected, expected = n · p."""
    expected = counts.sum() * probs / probs.sum()
    return float(((counts - expected) ** 2 / expected).sum())


@pytest.mark.parametrize(
    ("drafts", "target", "expected"),
    [
        ([5, 6, 7], [5, 6, 9, 2], [5, 6, 9]),  # two accepted, then the target's token
        ([5, 6, 7], [5, 6, 7, 2], [5, 6, 7, 2]),  # all accepted, plus the bonus token
        ([5, 6, 7], [4, 6, 7, 2], [4]),  # the first differs: plain decoding's token
        ([], [3], [3]),  # no drafts: one token
    ],
)
def test_accept_greedy(drafts, target, expected):
    assert accept_greedy(drafts, target) == expected


def test_a_draft_the_target_is_sure_of_is_always_accepted_and_one_it_excludes_never():
    p = torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
    g = torch.Generator().manual_seed(0)
    assert all(rejection_sample(p, [1], None, g) == [1, 2] for _ in range(50))
    p = torch.tensor([[0.0, 0.0, 1.0], [1.0, 0.0, 0.0]])
    assert all(rejection_sample(p, [1], None, g) == [2] for _ in range(50))


def test_rejection_sampling_keeps_the_target_distribution_with_sampled_drafts():
    draws = torch.Generator().manual_seed(1)  # the draft model's draws
    g = torch.Generator().manual_seed(2)  # the request's generator
    first = torch.zeros(5)
    second_after_accept = torch.zeros(5)
    lengths = torch.zeros(4)
    for _ in range(20_000):
        drafts = [int(torch.multinomial(Q[i], 1, generator=draws)) for i in range(2)]
        tokens = rejection_sample(P, drafts, Q, g)
        first[tokens[0]] += 1
        lengths[len(tokens)] += 1
        if len(tokens) >= 2:  # draft 1 accepted: the next token is p_1's
            second_after_accept[tokens[1]] += 1
    assert chi_square(first, P[0]) < CHI2_999[4]
    assert chi_square(second_after_accept, P[1]) < CHI2_999[4]
    # Acceptance of draft 1: Σ_x q(x) min(1, p(x)/q(x)) = Σ_x min(p(x), q(x)) = 0.65.
    assert lengths[2:].sum() / 20_000 == pytest.approx(0.65, abs=0.015)


def test_rejection_sampling_keeps_the_target_distribution_with_point_mass_drafts():
    # An n-gram proposal: the drafts are fixed tokens, q a point mass on each. Rows need not be
    # normalised (top-k / min-p leave them so).
    g = torch.Generator().manual_seed(3)
    p = P * 3.0
    first = torch.zeros(5)
    accepted_first = 0
    for _ in range(20_000):
        tokens = rejection_sample(p, [3, 0], None, g)
        first[tokens[0]] += 1
        accepted_first += len(tokens) >= 2
    assert chi_square(first, P[0]) < CHI2_999[4]
    assert accepted_first / 20_000 == pytest.approx(0.25, abs=0.015)  # p_0(3)


def test_rejection_sampling_never_draws_a_token_the_target_excludes():
    p = torch.tensor([[0.5, 0.5, 0.0, 0.0], [0.0, 0.0, 0.0, 1.0]])  # top-k cut tokens 2 and 3
    q = torch.tensor([[0.0, 0.0, 1.0, 0.0]])
    g = torch.Generator().manual_seed(4)
    counts = torch.zeros(4)
    for _ in range(2_000):
        (token,) = rejection_sample(p, [2], q, g)  # always rejected: p(2) = 0
        counts[token] += 1
    assert counts[2:].sum() == 0 and chi_square(counts[:2], p[0, :2]) < 10.83


def make_seq(params: SamplingParams, draft_ids: list[int], seed: int = 0) -> Sequence:
    seq = Sequence(
        request_id="r",
        prompt_ids=[1, 2],
        params=params,
        generator=torch.Generator().manual_seed(seed),
        detokenizer=None,
        stop_matcher=None,
        arrival_ns=0,
    )
    seq.num_computed_tokens = 1  # one token left: decoding
    seq.spec_token_ids = list(draft_ids)
    return seq


def one_hot_logits(token_ids: list[int], vocab: int = 6) -> torch.Tensor:
    logits = torch.zeros(len(token_ids), vocab)
    logits[torch.arange(len(token_ids)), torch.tensor(token_ids)] = 10.0
    return logits


def test_verify_splits_the_rows_by_sequence_in_batch_order():
    greedy = SamplingParams(temperature=0.0)
    plain = make_seq(greedy, [])  # 1 row: argmax 4
    a = make_seq(greedy, [3, 5])  # 3 rows: argmax 3, 1, 0 → draft 3 accepted, then 1
    b = make_seq(greedy, [2])  # 2 rows: argmax 2, 5 → accepted, bonus 5
    items = [ScheduledSeq(plain, 1), ScheduledSeq(a, 3, (3, 5)), ScheduledSeq(b, 2, (2,))]
    logits = one_hot_logits([4, 3, 1, 0, 2, 5])
    assert verify(logits, items) == [[4], [3, 1], [2, 5]]


def test_verify_applies_logit_bias_to_every_draft_row():
    biased = SamplingParams(temperature=0.0, logit_bias={1: 100.0})
    seq = make_seq(biased, [3, 1])
    logits = one_hot_logits([3, 1, 0])  # without the bias: 3 accepted, 1 accepted, then 0
    assert verify(logits, [ScheduledSeq(seq, 3, (3, 1))]) == [[1]]  # the bias wins row 0


def test_verify_samples_a_sampled_sequences_drafts_by_the_rule():
    # Logits so peaked that sampling is as good as argmax: draft 3 accepted, draft 5 rejected
    # (p_1(5) ~ 0), the token drawn there is row 1's argmax.
    params = SamplingParams(temperature=1.0, seed=0)
    seq = make_seq(params, [3, 5])
    logits = one_hot_logits([3, 1, 0]) * 5
    assert verify(logits, [ScheduledSeq(seq, 3, (3, 5))]) == [[3, 1]]
