"""Tests for llmbench.engine.speculative: the settings, the `--speculative` syntax, and prompt
lookup (n-gram drafting)."""

from __future__ import annotations

import pytest

from llmbench.engine.sampling import SamplingParams
from llmbench.engine.sequence import Sequence
from llmbench.engine.speculative import (
    NgramProposer,
    SpeculativeConfig,
    max_draft_tokens,
    parse_speculative,
    propose_ngram,
)
from llmbench.errors import UserError

# --- settings and syntax ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("none", SpeculativeConfig()),
        ("ngram", SpeculativeConfig(method="ngram", num_tokens=4)),
        ("ngram:6", SpeculativeConfig(method="ngram", num_tokens=6)),
        ("draft:self:layers=8", SpeculativeConfig(method="draft", draft_model="self:layers=8")),
        (
            "draft:self:layers=8:3",
            SpeculativeConfig(method="draft", num_tokens=3, draft_model="self:layers=8"),
        ),
        (
            "draft:synthetic:tiny:2",
            SpeculativeConfig(method="draft", num_tokens=2, draft_model="synthetic:tiny"),
        ),
        ("draft:/models/x.gguf", SpeculativeConfig(method="draft", draft_model="/models/x.gguf")),
        ("ngram:adaptive", SpeculativeConfig(method="ngram", adaptive=True)),
        ("ngram:8:adaptive", SpeculativeConfig(method="ngram", num_tokens=8, adaptive=True)),
        (
            "draft:self:layers=8:3:adaptive",
            SpeculativeConfig(
                method="draft", num_tokens=3, draft_model="self:layers=8", adaptive=True
            ),
        ),
    ],
)
def test_parse_speculative(text, expected):
    assert parse_speculative(text) == expected


@pytest.mark.parametrize(
    "text",
    ["draft", "draft:4", "ngram:x", "ngram:self:4", "eagle:4", "", "ngram:adaptive:4", "adaptive"],
)
def test_parse_speculative_refuses_with_the_syntax(text):
    syntax = r"none \| ngram\[:K\]\[:adaptive\] \| draft:MODEL\[:K\]\[:adaptive\]"
    with pytest.raises(UserError, match=syntax):
        parse_speculative(text)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"method": "medusa"}, "method must be one of none, ngram, draft"),
        ({"num_tokens": 0}, "num_tokens must be an integer >= 1"),
        ({"ngram_min": 3, "ngram_max": 2}, "need 1 <= ngram_min <= ngram_max"),
        ({"ngram_min": 0}, "need 1 <= ngram_min <= ngram_max"),
        ({"method": "draft"}, "method draft needs a draft_model"),
        ({"method": "ngram", "adaptive": "yes"}, "adaptive must be true or false, got 'yes'"),
    ],
)
def test_config_refuses_impossible_settings(kwargs, message):
    with pytest.raises(UserError, match=message):
        SpeculativeConfig(**kwargs)


# --- prompt lookup ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tokens", "ngram_min", "ngram_max", "k", "expected"),
    [
        # "a b" (1 2) occurred at 0: propose what followed it.
        ([1, 2, 3, 4, 5, 1, 2], 1, 2, 3, [3, 4, 5]),
        # k caps the proposal; the tokens after the match run out at the sequence's end.
        ([1, 2, 3, 4, 5, 1, 2], 1, 2, 2, [3, 4]),
        ([7, 1, 2, 9, 1, 2], 2, 2, 5, [9, 1, 2]),
        # The latest occurrence wins: "1 2" at 0 (then 3) and at 3 (then 4).
        ([1, 2, 3, 1, 2, 4, 1, 2], 2, 2, 1, [4]),
        # The longest n-gram wins: "5 1 2" matches at 3 (then 6); "1 2" alone matches later.
        ([0, 0, 0, 5, 1, 2, 6, 1, 2, 7, 5, 1, 2], 2, 3, 1, [6]),
        # n below ngram_min is never tried: only "2" would match.
        ([2, 3, 9, 2], 2, 3, 2, []),
        ([2, 3, 9, 2], 1, 3, 2, [3, 9]),
        # Nothing to find: too short, no earlier occurrence, or k = 0.
        ([1], 1, 3, 4, []),
        ([1, 2, 3, 4], 1, 3, 4, []),
        ([1, 2, 1, 2], 1, 2, 0, []),
        # A repeated token: the suffix "5 5" overlaps itself; what follows the hit is proposed.
        ([5, 5, 5], 2, 2, 4, [5]),
    ],
)
def test_propose_ngram(tokens, ngram_min, ngram_max, k, expected):
    assert propose_ngram(tokens, ngram_min, ngram_max, k) == expected


def test_propose_ngram_ignores_byte_matches_that_straddle_tokens():
    # As little-endian int32 bytes, 256 then 0 is 00 01 00 00 | 00 00 00 00: the bytes of
    # token 1 (01 00 00 00) occur at byte offset 1, across the two, where no token is 1.
    assert propose_ngram([256, 0, 7, 1], 1, 1, 2) == []
    assert propose_ngram([1, 8, 256, 0, 7, 1], 1, 1, 2) == [8, 256]


def make_seq(tokens: list[int], num_prompt: int, max_tokens: int) -> Sequence:
    seq = Sequence(
        request_id="r",
        prompt_ids=tokens[:num_prompt],
        params=SamplingParams(max_tokens=max_tokens),
        generator=None,
        detokenizer=None,
        stop_matcher=None,
        arrival_ns=0,
    )
    seq.token_ids = list(tokens)
    return seq


@pytest.mark.parametrize(
    ("num_output", "max_tokens", "k", "expected"),
    [(0, 16, 4, 4), (10, 16, 4, 4), (12, 16, 4, 3), (15, 16, 4, 0), (16, 16, 4, 0)],
)
def test_max_draft_tokens_leaves_room_for_the_token_verification_adds(
    num_output, max_tokens, k, expected
):
    seq = make_seq([1] * (3 + num_output), 3, max_tokens)
    assert max_draft_tokens(seq, k) == expected


def test_ngram_proposer_sets_point_mass_drafts_within_max_tokens():
    proposer = NgramProposer(SpeculativeConfig(method="ngram", num_tokens=4, ngram_min=1))
    # 5 prompt tokens + 1 output of at most 3: room for 1 draft (3 - 1 - 1).
    seq = make_seq([1, 2, 3, 4, 1, 2], 5, max_tokens=3)
    proposer.propose([seq], [seq])
    assert seq.spec_token_ids == [3] and seq.spec_probs is None
    assert proposer.draft_passes == ()
