"""Tests for llmbench.engine.sampling: params validation, the batched sampler, stop handling.

Distribution tests draw thousands of tokens from fixed seeds, so they are deterministic; the
tolerances (4 binomial standard deviations, chi-square at p = 0.001) say how far a correct
sampler could plausibly land from the exact probabilities, so a pass is meaningful.
"""

from __future__ import annotations

import math

import pytest
import torch

from llmbench.engine.sampling import (
    SamplingParams,
    apply_logit_bias,
    check_stop,
    greedy_ids,
    make_generator,
    sample,
    sampling_probs,
)
from llmbench.errors import UserError

# Ten hand-picked logits with distinct values: top 3 are ids 1 (3.0), 3 (2.5), 4 (2.0).
LOGITS_10 = torch.tensor([1.0, 3.0, 0.5, 2.5, 2.0, 0.0, -1.0, 1.5, 0.2, 1.9])


def log_probs(probs: list[float]) -> torch.Tensor:
    """Logits whose softmax is exactly `probs` (up to float rounding)."""
    return torch.tensor(probs, dtype=torch.float64).log().float()


def draw_counts(row: torch.Tensor, params: SamplingParams, num_draws: int, seed: int) -> list[int]:
    """Sample `num_draws` tokens from one logits row; return how often each id came up."""
    logits = row.expand(num_draws, -1)  # [N, V]
    generator = make_generator(seed)
    token_ids = sample(logits, [params] * num_draws, [generator] * num_draws)
    return torch.bincount(token_ids, minlength=row.shape[0]).tolist()


def assert_frequencies(counts: list[int], expected: list[float]) -> None:
    """Each id's frequency is within 4 binomial standard deviations of its probability."""
    num_draws = sum(counts)
    for token_id, (count, p) in enumerate(zip(counts, expected, strict=True)):
        if p == 0:
            assert count == 0, f"id {token_id} has probability 0 but was drawn {count} times"
            continue
        std = math.sqrt(p * (1 - p) / num_draws)
        assert abs(count / num_draws - p) <= 4 * std, (token_id, count / num_draws, p)


# --- SamplingParams ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_tokens": 0}, "sampling: max_tokens must be an integer >= 1, got 0"),
        ({"max_tokens": 2.5}, "sampling: max_tokens must be an integer >= 1, got 2.5"),
        ({"temperature": -1.0}, "sampling: temperature must be >= 0, got -1.0"),
        ({"temperature": math.nan}, "sampling: temperature must be >= 0, got nan"),
        ({"temperature": math.inf}, "sampling: temperature must be >= 0, got inf"),
        ({"top_k": -1}, "sampling: top_k must be 0 (off) or an integer in [1, 2147483647], got -1"),
        (
            {"top_k": True},
            "sampling: top_k must be 0 (off) or an integer in [1, 2147483647], got True",
        ),
        (
            {"top_k": 10**30},
            "sampling: top_k must be 0 (off) or an integer in [1, 2147483647], got "
            "1000000000000000000000000000000",
        ),
        ({"top_p": 0.0}, "sampling: top_p must be in (0, 1], got 0.0"),
        ({"top_p": 1.5}, "sampling: top_p must be in (0, 1], got 1.5"),
        ({"min_p": -0.1}, "sampling: min_p must be in [0, 1], got -0.1"),
        ({"min_p": 1.1}, "sampling: min_p must be in [0, 1], got 1.1"),
        ({"seed": "7"}, "sampling: seed must be an integer or null, got '7'"),
        ({"stop": ("ok", "")}, "sampling: stop entries must be non-empty strings, got ''"),
        (
            {"stop_token_ids": [3, -1]},
            "sampling: stop_token_ids entries must be integers >= 0, got -1",
        ),
        ({"ignore_eos": "yes"}, "sampling: ignore_eos must be true or false, got 'yes'"),
        (
            {"logit_bias": {"5": 1.0}},
            "sampling: logit_bias keys must be token ids (integers >= 0), got '5'",
        ),
        (
            {"logit_bias": {-1: 1.0}},
            "sampling: logit_bias keys must be token ids (integers >= 0), got -1",
        ),
        (
            {"logit_bias": {5: 100.5}},
            "sampling: logit_bias values must be in [-100, 100], got 100.5",
        ),
        (
            {"logit_bias": {5: math.nan}},
            "sampling: logit_bias values must be in [-100, 100], got nan",
        ),
        ({"logit_bias": {5: "1"}}, "sampling: logit_bias values must be in [-100, 100], got '1'"),
        ({"logit_bias": 5}, "sampling: logit_bias must be a mapping of token id to bias, got 5"),
        (
            {"logit_bias": [(3, 1.0), (3, 2.0)]},
            "sampling: logit_bias must name each token id once, got [3, 3]",
        ),
    ],
)
def test_params_reject_invalid_field_with_its_name(kwargs: dict, message: str) -> None:
    with pytest.raises(UserError) as excinfo:
        SamplingParams(**kwargs)
    assert str(excinfo.value) == message


def test_params_accept_range_edges() -> None:
    params = SamplingParams(max_tokens=1, temperature=0, top_k=0, top_p=1.0, min_p=1.0, seed=-5)
    assert params.max_tokens == 1
    SamplingParams(top_k=1, top_p=1e-6, min_p=0.0, temperature=100)


def test_params_normalise_lists_to_tuples() -> None:
    params = SamplingParams(stop=["\n\n", "###"], stop_token_ids=[128001, 128009])
    assert params.stop == ("\n\n", "###")
    assert params.stop_token_ids == (128001, 128009)
    # A lone string is one stop string, not three one-character ones.
    assert SamplingParams(stop="###").stop == ("###",)
    # Tuples keep the frozen dataclass hashable.
    assert hash(params) == hash(
        SamplingParams(stop=("\n\n", "###"), stop_token_ids=(128001, 128009))
    )


def test_params_store_logit_bias_as_sorted_pairs() -> None:
    params = SamplingParams(logit_bias={9: -100, 2: 0.5, 4: 100})
    assert params.logit_bias == ((2, 0.5), (4, 100), (9, -100))
    assert hash(params) == hash(SamplingParams(logit_bias=[(4, 100), (9, -100), (2, 0.5)]))
    assert SamplingParams().logit_bias == ()


def test_is_greedy() -> None:
    assert SamplingParams(temperature=0).is_greedy
    assert SamplingParams(temperature=0.0, top_k=5).is_greedy
    assert not SamplingParams(temperature=1e-3).is_greedy
    assert not SamplingParams().is_greedy


# --- greedy ----------------------------------------------------------------------------------


def test_all_greedy_batch_is_argmax_with_lowest_id_on_ties() -> None:
    logits = torch.tensor(
        [
            [0.0, 5.0, 5.0, 1.0],  # tie between ids 1 and 2 -> 1
            [9.0, -1.0, 3.0, 9.0],  # tie between ids 0 and 3 -> 0
            [-3.0, -2.0, -1.0, -0.5],
        ]
    )
    greedy = SamplingParams(temperature=0)
    token_ids = sample(logits, [greedy] * 3, [None] * 3)
    assert token_ids.tolist() == [1, 0, 3]
    assert token_ids.dtype == torch.int64


def test_greedy_random_batch_matches_argmax_in_bfloat16() -> None:
    logits = torch.randn(8, 50, generator=torch.Generator().manual_seed(0)).bfloat16()
    token_ids = sample(logits, [SamplingParams(temperature=0)] * 8, [None] * 8)
    assert token_ids.tolist() == logits.float().argmax(dim=-1).tolist()


def test_mixed_batch_greedy_rows_are_argmax_and_sampled_rows_obey_filters() -> None:
    logits = torch.stack([LOGITS_10, LOGITS_10.flip(0), LOGITS_10, LOGITS_10.flip(0)])  # [4, 10]
    greedy = SamplingParams(temperature=0)
    top2 = SamplingParams(temperature=5.0, top_k=2)  # hot, so both of the top 2 come up
    params = [greedy, top2, top2, greedy]
    seen: list[set[int]] = [set(), set(), set(), set()]
    generators = [None, make_generator(1), make_generator(2), None]
    for _ in range(200):
        for row, token_id in enumerate(sample(logits, params, generators).tolist()):
            seen[row].add(token_id)
    assert seen[0] == {1}  # argmax of LOGITS_10
    assert seen[3] == {8}  # argmax of the flipped row: id 9 - 1
    assert seen[1] == {8, 6}  # top 2 of the flipped row: ids 9 - 1 and 9 - 3
    assert seen[2] == {1, 3}


def test_sample_rejects_mismatched_lengths() -> None:
    with pytest.raises(ValueError, match="2 logit rows, 1 params, 2 generators"):
        sample(torch.zeros(2, 4), [SamplingParams()], [None, None])


def test_sample_rejects_generator_on_another_device() -> None:
    # "meta" logits stand in for CUDA ones on a CPU-only machine: the check runs before any maths.
    logits = torch.zeros(2, 4, device="meta")
    params = [SamplingParams(temperature=0), SamplingParams()]
    with pytest.raises(ValueError, match="row 1's generator is on cpu but the logits are on meta"):
        sample(logits, params, [None, make_generator(0)])


def test_top_k_tie_across_a_large_vocabulary_keeps_lowest_id() -> None:
    # Torch's default sort is not stable at this size; the filter must still match argmax.
    logits = torch.zeros(1, 5000)
    logits[0, ::7] = 1.0
    probs = sampling_probs(logits, [SamplingParams(top_k=1)])[0]
    assert probs.nonzero().flatten().tolist() == [0]


# --- sampling_probs: hand-computed filtered distributions ------------------------------------


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        # No filter: softmax(log p) = p.
        (SamplingParams(), [0.5, 0.3, 0.1, 0.1]),
        (SamplingParams(top_k=2), [0.625, 0.375, 0.0, 0.0]),
        (SamplingParams(top_k=100), [0.5, 0.3, 0.1, 0.1]),  # k > V keeps everything
        (SamplingParams(top_k=1), [1.0, 0.0, 0.0, 0.0]),
        # 0.5 < 0.75 so id 1 is needed; 0.5 + 0.3 = 0.8 >= 0.75 so ids 2, 3 are not.
        (SamplingParams(top_p=0.75), [0.625, 0.375, 0.0, 0.0]),
        (SamplingParams(top_p=0.85), [0.5 / 0.9, 0.3 / 0.9, 0.1 / 0.9, 0.0]),
        (SamplingParams(top_p=0.4), [1.0, 0.0, 0.0, 0.0]),  # the top token is always kept
        # Threshold 0.3 * 0.5 = 0.15: ids 2, 3 (0.1) go.
        (SamplingParams(min_p=0.3), [0.625, 0.375, 0.0, 0.0]),
        (SamplingParams(min_p=0.1), [0.5, 0.3, 0.1, 0.1]),
        (SamplingParams(min_p=1.0), [1.0, 0.0, 0.0, 0.0]),
        # T = 0.5 squares the probabilities: [0.25, 0.09, 0.01, 0.01] / 0.36 = [.694, .25, ...];
        # top_p 0.9 then keeps ids 0, 1 (0.694 < 0.9 <= 0.944).
        (SamplingParams(temperature=0.5, top_p=0.9), [0.25 / 0.34, 0.09 / 0.34, 0.0, 0.0]),
        # T = 2 takes square roots: sqrt(p) / sum = [.387, .300, .173, .173] (hand-checked).
        (
            SamplingParams(temperature=2.0),
            [
                math.sqrt(p) / sum(math.sqrt(q) for q in (0.5, 0.3, 0.1, 0.1))
                for p in (0.5, 0.3, 0.1, 0.1)
            ],
        ),
    ],
)
def test_sampling_probs_hand_computed(params: SamplingParams, expected: list[float]) -> None:
    probs = sampling_probs(log_probs([0.5, 0.3, 0.1, 0.1])[None, :], [params])[0]
    normalised = probs / probs.sum()
    assert normalised.tolist() == pytest.approx(expected, abs=1e-6)
    # Filtered tokens are exactly zero, so multinomial can never draw them.
    assert [p == 0 for p in probs.tolist()] == [p == 0 for p in expected]


# --- logit_bias ------------------------------------------------------------------------------


def test_logit_bias_changes_the_greedy_argmax_of_its_row_only() -> None:
    logits = torch.tensor([[1.0, 2.0, 3.0], [1.0, 2.0, 3.0]])
    rows = [SamplingParams(temperature=0, logit_bias={0: 2.5}), SamplingParams(temperature=0)]
    # Row 0: [3.5, 2, 3] -> id 0; row 1 unbiased -> id 2. The caller's logits are not touched.
    assert sample(logits, rows, [None, None]).tolist() == [0, 2]
    assert logits.tolist() == [[1.0, 2.0, 3.0], [1.0, 2.0, 3.0]]


def test_logit_bias_is_exact_on_bfloat16_logits() -> None:
    # 256 + 0.5 is not a bfloat16 (spacing 2 there): the bias is added in float32, so id 1 wins.
    logits = torch.tensor([[256.0, 256.0]], dtype=torch.bfloat16)
    params = [SamplingParams(temperature=0, logit_bias={1: 0.5})]
    assert apply_logit_bias(logits, params).tolist() == [[256.0, 256.5]]
    assert sample(logits, params, [None]).tolist() == [1]


def test_minus_100_bans_a_token_and_plus_100_forces_one() -> None:
    logits = torch.tensor([[5.0, 4.0, 3.0]])
    assert sample(logits, [SamplingParams(temperature=0, logit_bias={0: -100})], [None]) == 1
    forced = SamplingParams(temperature=1.0, logit_bias={2: 100}, seed=0)
    draws = sample(logits.expand(200, -1), [forced] * 200, [make_generator(0)] * 200)
    assert set(draws.tolist()) == {2}  # p(other) = e^-95 or less per draw


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        # Uniform logits, +ln 3 on id 1: weights [1, 3, 1, 1] / 6.
        (SamplingParams(logit_bias={1: math.log(3)}), [1 / 6, 3 / 6, 1 / 6, 1 / 6]),
        # The bias comes before the temperature: (0 + 2 ln 3) / 2 = ln 3 on id 0.
        (
            SamplingParams(temperature=2.0, logit_bias={0: 2 * math.log(3)}),
            [3 / 6, 1 / 6, 1 / 6, 1 / 6],
        ),
        # ... and before top-k: biased [0, ln 3, ln 5, 0], top-2 keeps ids 2 and 1: [3, 5] / 8.
        (
            SamplingParams(top_k=2, logit_bias={1: math.log(3), 2: math.log(5)}),
            [0.0, 3 / 8, 5 / 8, 0.0],
        ),
    ],
)
def test_logit_bias_probs_hand_computed(params: SamplingParams, expected: list[float]) -> None:
    probs = sampling_probs(torch.zeros(1, 4), [params])[0]
    assert (probs / probs.sum()).tolist() == pytest.approx(expected, abs=1e-6)


def test_logit_bias_draws_follow_the_biased_distribution() -> None:
    params = SamplingParams(logit_bias={1: math.log(3)}, seed=3)
    counts = draw_counts(torch.zeros(4), params, 8_000, seed=3)
    assert_frequencies(counts, [1 / 6, 3 / 6, 1 / 6, 1 / 6])


def test_top_p_applies_after_top_k_renormalises() -> None:
    # Top-k 2 leaves [0.4, 0.3] -> [4/7, 3/7]; the mass above id 1 is now 4/7 >= 0.5, so top-p
    # 0.5 drops it. Top-p alone would keep id 1 (mass above it 0.4 < 0.5).
    logits = log_probs([0.4, 0.3, 0.2, 0.1])[None, :]
    both = sampling_probs(logits, [SamplingParams(top_k=2, top_p=0.5)])[0]
    assert both.tolist() == pytest.approx([1.0, 0.0, 0.0, 0.0], abs=1e-6)
    top_p_only = sampling_probs(logits, [SamplingParams(top_p=0.5)])[0]
    assert top_p_only.tolist() == pytest.approx([4 / 7, 3 / 7, 0.0, 0.0], abs=1e-6)


def test_top_k_tie_keeps_lowest_id_like_argmax() -> None:
    logits = torch.tensor([[1.0, 2.0, 2.0, 0.0]])
    probs = sampling_probs(logits, [SamplingParams(top_k=1)])[0]
    assert probs.tolist() == [0.0, 1.0, 0.0, 0.0]


def reference_probs(row: list[float], params: SamplingParams) -> list[float]:
    """The filters written out one token at a time in float64, straight from their definitions."""
    scaled = [x / params.temperature for x in row]
    by_rank = sorted(range(len(row)), key=lambda i: (-scaled[i], i))
    kept = by_rank[: params.top_k or len(row)]

    def softmax_over(ids: list[int]) -> dict[int, float]:
        top = max(scaled[i] for i in ids)
        weights = {i: math.exp(scaled[i] - top) for i in ids}
        total = sum(weights.values())
        return {i: w / total for i, w in weights.items()}

    probs = softmax_over(kept)
    if params.top_p < 1:
        nucleus, mass = [], 0.0
        for i in kept:  # kept is in rank order
            if mass >= params.top_p:
                break
            nucleus.append(i)
            mass += probs[i]
        kept = nucleus
        probs = softmax_over(kept)
    if params.min_p > 0:
        top = max(probs.values())
        kept = [i for i in kept if probs[i] >= params.min_p * top]
        probs = softmax_over(kept)
    return [probs.get(i, 0.0) for i in range(len(row))]


def test_sampling_probs_matches_reference_on_heterogeneous_batch() -> None:
    # One batch, every row with different settings: the batched filters must stay per-row.
    settings = [
        SamplingParams(temperature=t, top_k=k, top_p=p, min_p=m)
        for t in (0.3, 1.0, 1.7)
        for k in (0, 1, 5, 40)
        for p in (1.0, 0.9, 0.5)
        for m in (0.0, 0.05, 0.3)
    ]
    logits = 2.0 * torch.randn(len(settings), 32, generator=torch.Generator().manual_seed(42))
    probs = sampling_probs(logits, settings)
    probs = probs / probs.sum(dim=-1, keepdim=True)
    for row, params in enumerate(settings):
        expected = reference_probs(logits[row].double().tolist(), params)
        assert probs[row].tolist() == pytest.approx(expected, abs=1e-5), params


# --- sample: distributions over thousands of draws -------------------------------------------


def test_top_k_never_leaves_the_top_k() -> None:
    counts = draw_counts(LOGITS_10, SamplingParams(top_k=3), num_draws=5000, seed=0)
    drawn = {token_id for token_id, count in enumerate(counts) if count}
    assert drawn == {1, 3, 4}
    top3 = torch.softmax(LOGITS_10[[1, 3, 4]], dim=0).tolist()
    expected = [0.0] * 10
    for token_id, p in zip([1, 3, 4], top3, strict=True):
        expected[token_id] = p
    assert_frequencies(counts, expected)


def test_top_p_keeps_the_nucleus_with_renormalised_frequencies() -> None:
    counts = draw_counts(
        log_probs([0.5, 0.3, 0.1, 0.1]), SamplingParams(top_p=0.75), num_draws=20000, seed=1
    )
    assert counts[2] == counts[3] == 0
    assert_frequencies(counts, [0.5 / 0.8, 0.3 / 0.8, 0.0, 0.0])


def test_min_p_drops_tokens_below_threshold() -> None:
    # Threshold 0.3 * 0.4 = 0.12: ids 3 (0.1) and 4 (0.05) go, id 2 (0.15) stays.
    counts = draw_counts(
        log_probs([0.4, 0.3, 0.15, 0.1, 0.05]), SamplingParams(min_p=0.3), num_draws=20000, seed=2
    )
    assert_frequencies(counts, [0.4 / 0.85, 0.3 / 0.85, 0.15 / 0.85, 0.0, 0.0])


# Chi-square critical value, 9 degrees of freedom (V = 10), p = 0.001, from standard tables.
CHI2_9DF_P001 = 27.877


@pytest.mark.parametrize("temperature", [0.5, 1.0, 2.0])
def test_temperature_frequencies_match_softmax(temperature: float) -> None:
    num_draws = 20000
    counts = draw_counts(
        LOGITS_10, SamplingParams(temperature=temperature), num_draws=num_draws, seed=3
    )
    expected = torch.softmax(LOGITS_10.double() / temperature, dim=0).tolist()
    chi2 = sum(
        (c - num_draws * p) ** 2 / (num_draws * p) for c, p in zip(counts, expected, strict=True)
    )
    assert chi2 < CHI2_9DF_P001, (counts, expected)


# --- reproducibility -------------------------------------------------------------------------


def draw_sequence(seed: int, num_steps: int = 100) -> list[int]:
    """One request decoding `num_steps` tokens from the same logits, as the engine would."""
    params = SamplingParams(seed=seed)
    generator = make_generator(params.seed)
    return [sample(LOGITS_10[None, :], [params], [generator]).item() for _ in range(num_steps)]


def test_same_seed_same_tokens_different_seed_different_tokens() -> None:
    assert draw_sequence(1234) == draw_sequence(1234)
    assert draw_sequence(1234) != draw_sequence(1235)


def test_seeded_row_draws_the_same_tokens_whatever_the_batch() -> None:
    alone = draw_sequence(77, num_steps=50)
    # The same request in row 2 of a batch, next to greedy and unseeded sampled rows.
    params = [SamplingParams(temperature=0), SamplingParams(top_k=4), SamplingParams(seed=77)]
    generators = [None, make_generator(None), make_generator(77)]
    logits = torch.stack([LOGITS_10.flip(0), LOGITS_10 * 3, LOGITS_10])
    in_batch = [sample(logits, params, generators)[2].item() for _ in range(50)]
    assert in_batch == alone


def test_unseeded_generators_follow_the_global_rng() -> None:
    torch.manual_seed(0)
    first, second = make_generator(None), make_generator(None)
    assert first.initial_seed() != second.initial_seed()
    torch.manual_seed(0)
    assert make_generator(None).initial_seed() == first.initial_seed()
    assert make_generator(5).initial_seed() == 5


def test_sampled_row_without_generator_uses_global_rng() -> None:
    params = [SamplingParams(temperature=2.0)] * 64
    torch.manual_seed(9)
    first = sample(LOGITS_10.expand(64, -1), params, [None] * 64)
    torch.manual_seed(9)
    second = sample(LOGITS_10.expand(64, -1), params, [None] * 64)
    assert first.tolist() == second.tolist()
    assert len(set(first.tolist())) > 1  # it really sampled, not argmax


# --- check_stop ------------------------------------------------------------------------------

EOS_IDS = frozenset({128001, 128009})  # Llama 3 has more than one EOS token


def test_check_stop_eos() -> None:
    params = SamplingParams(max_tokens=4)
    assert check_stop(128009, 1, params, EOS_IDS) == "stop"
    assert check_stop(128001, 1, params, EOS_IDS) == "stop"
    assert check_stop(42, 1, params, EOS_IDS) is None


def test_check_stop_ignore_eos_runs_to_length() -> None:
    params = SamplingParams(max_tokens=4, ignore_eos=True)
    assert check_stop(128009, 3, params, EOS_IDS) is None
    assert check_stop(128009, 4, params, EOS_IDS) == "length"


def test_check_stop_stop_token_ids() -> None:
    params = SamplingParams(max_tokens=4, stop_token_ids=(7,), ignore_eos=True)
    assert check_stop(7, 1, params, EOS_IDS) == "stop"  # even with ignore_eos
    assert check_stop(8, 1, params, EOS_IDS) is None


def test_check_stop_length() -> None:
    params = SamplingParams(max_tokens=4)
    assert check_stop(42, 3, params, EOS_IDS) is None
    assert check_stop(42, 4, params, EOS_IDS) == "length"
    # EOS as the last allowed token is a natural stop, not a truncation.
    assert check_stop(128001, 4, params, EOS_IDS) == "stop"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_greedy_ids_are_torchs_argmax_ties_and_nan_included(dtype):
    """The first of equal maxima, a NaN counted as the largest, -inf rows: row by row the index
    torch's argmax gives (float32 on a CPU goes through numpy's)."""
    nan, inf = float("nan"), float("inf")
    logits = torch.tensor(
        [
            [1.0, 3.0, 3.0, 2.0],  # a tie: the first
            [nan, 5.0, nan, 1.0],  # NaN wins, the first of them
            [2.0, 7.0, 1.0, nan],
            [-inf, -inf, -inf, -inf],
            [0.0, inf, inf, 1.0],
        ],
        dtype=dtype,
    )
    ids = greedy_ids(logits)
    assert ids.tolist() == [1, 0, 3, 0, 1] == logits.argmax(dim=-1).tolist()
    assert ids.dtype == torch.int64
    wide = torch.randn(3, 49152, generator=torch.Generator().manual_seed(0)).to(dtype)
    assert torch.equal(greedy_ids(wide), wide.argmax(dim=-1))
    assert torch.equal(greedy_ids(wide[:, ::2]), wide[:, ::2].argmax(dim=-1))  # strided rows
