"""Tests for llmbench.engine.draft_model: which drafts are accepted, and that the proposer's
tokens are the draft model's own greedy continuation, before and after a rollback."""

from __future__ import annotations

import json
import re

import pytest
import torch

from llmbench.engine.draft_model import open_draft_model, truncated
from llmbench.engine.engine import EngineConfig, LLMEngine
from llmbench.engine.runner import ModelRunner
from llmbench.engine.sampling import SamplingParams
from llmbench.engine.sequence import Sequence
from llmbench.engine.speculative import SpeculativeConfig
from llmbench.errors import UserError
from tests.engine.helpers import VOCAB, write_tiny_checkpoint

GREEDY = SamplingParams(max_tokens=64, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def target_folder(tmp_path_factory):
    return str(write_tiny_checkpoint(tmp_path_factory.mktemp("target")))


@pytest.fixture(scope="module")
def draft_folder(tmp_path_factory):
    """Another random model with the target's shapes and tokenizer: a poor but honest draft."""
    return str(write_tiny_checkpoint(tmp_path_factory.mktemp("draft"), seed=1))


def engine_with_draft(target: str, draft: str, k: int = 3, **kwargs) -> LLMEngine:
    spec = SpeculativeConfig(method="draft", num_tokens=k, draft_model=draft)
    config = EngineConfig(
        model=target, device="cpu", kv_cache_memory=1 << 22, speculative=spec, **kwargs
    )
    return LLMEngine(config)


def decoding_seq(token_ids: list[int], params: SamplingParams = GREEDY) -> Sequence:
    """A sequence whose tokens are all computed but the last (what the proposer is given)."""
    seq = Sequence(
        request_id="r",
        prompt_ids=list(token_ids),
        params=params,
        generator=torch.Generator().manual_seed(0),
        detokenizer=None,
        stop_matcher=None,
        arrival_ns=0,
    )
    seq.num_computed_tokens = len(token_ids) - 1
    return seq


def test_self_layers_is_a_view_of_the_targets_first_layers(target_folder):
    engine = LLMEngine(EngineConfig(model=target_folder, device="cpu", kv_cache_memory=1 << 22))
    draft, description = open_draft_model(
        "self:layers=1", engine.model, engine.tokenizer, target_folder
    )
    assert description == "self:layers=1 (of 2)"
    assert draft.config.num_layers == 1 and engine.model.config.num_layers == 2
    assert draft.layers == engine.model.layers[:1] and draft.lm_head is engine.model.lm_head
    assert truncated(engine.model, 2).layers == engine.model.layers


def test_a_quantised_self_draft_is_a_second_copy_of_the_target(target_folder):
    engine = LLMEngine(EngineConfig(model=target_folder, device="cpu", kv_cache_memory=1 << 22))
    name = "self:layers=1,quantize=int8"
    draft, description = open_draft_model(name, engine.model, engine.tokenizer, target_folder)
    assert description == "self:layers=1 (of 2), quantize=int8"
    assert draft.quantize.name == "int8" and engine.model.quantize is None
    assert draft.config.num_layers == 1 and draft.layers[0] is not engine.model.layers[0]
    assert draft.weight_bytes["layers"] < engine.model.weight_bytes["layers"] / 2 / 3


@pytest.mark.parametrize(
    "name",
    [
        "self:layers=0",
        "self:layers=3",
        "self:depth=1",
        "self:",
        "self:layers=1,layers=2",
        "self:quantize=none",
    ],
)
def test_a_bad_self_draft_is_refused_in_one_line(target_folder, name):
    engine = LLMEngine(EngineConfig(model=target_folder, device="cpu", kv_cache_memory=1 << 22))
    message = "expected self:layers=N (1 <= N <= 2, the target's layers), self:quantize=SCHEME"
    with pytest.raises(UserError, match=re.escape(message)):
        open_draft_model(name, engine.model, engine.tokenizer, target_folder)
    with pytest.raises(UserError, match="quantize 'int5': unknown scheme"):
        open_draft_model("self:quantize=int5", engine.model, engine.tokenizer, target_folder)


def test_a_draft_with_another_vocabulary_is_refused(target_folder):
    with pytest.raises(UserError, match="its vocabulary has 512 tokens, the target's 300"):
        engine_with_draft(target_folder, "synthetic:tiny")


def test_a_draft_with_another_tokenizer_is_refused(target_folder, tmp_path):
    # The same shapes and vocabulary size, but two words trade ids: text splits the same way
    # into different ids, which a draft cannot be verified against.
    folder = write_tiny_checkpoint(tmp_path / "other", seed=1)
    data = json.loads((folder / "tokenizer.json").read_text())
    vocab = data["model"]["vocab"]
    vocab["w0"], vocab["w1"] = vocab["w1"], vocab["w0"]
    (folder / "tokenizer.json").write_text(json.dumps(data))
    with pytest.raises(UserError, match="its tokenizer splits text differently"):
        engine_with_draft(target_folder, str(folder))


def greedy_continuation(engine: LLMEngine, token_ids: list[int], k: int) -> list[int]:
    params = SamplingParams(max_tokens=k, temperature=0.0, ignore_eos=True)
    return engine.generate([token_ids], params)[0]


def test_proposals_are_the_drafts_greedy_continuation_across_rollbacks(target_folder, draft_folder):
    engine = engine_with_draft(target_folder, draft_folder, k=3)
    reference = LLMEngine(EngineConfig(model=draft_folder, device="cpu", kv_cache_memory=1 << 22))
    proposer = engine.proposer
    seq = decoding_seq([5, 9, 14, 2, 77, 31])
    proposer.propose([seq], [seq])
    first = list(seq.spec_token_ids)
    assert first == greedy_continuation(reference, seq.token_ids, 3)
    # The draft's passes: the 6 unseen tokens, then drafts 1 and 2, one row each.
    assert proposer.draft_passes == (((6, 6),), ((7, 1),), ((8, 1),))
    # The target accepted draft 1, then chose a token of its own (not draft 2).
    other = (first[1] + 1) % VOCAB
    seq.token_ids += [first[0], other]
    seq.num_computed_tokens = seq.num_tokens - 1
    proposer.propose([seq], [seq])
    assert seq.spec_token_ids == greedy_continuation(reference, seq.token_ids, 3)
    # Draft 1's K/V were kept: only the new token ran (context 8, 1 row).
    assert proposer.draft_passes[0] == ((8, 1),)
    # Everything accepted, plus a bonus token.
    seq.token_ids += [*seq.spec_token_ids, 3]
    seq.num_computed_tokens = seq.num_tokens - 1
    proposer.propose([seq], [seq])
    assert seq.spec_token_ids == greedy_continuation(reference, seq.token_ids, 3)
    # 12 tokens: drafts 1-2 kept (positions 8-9); draft 3 and the bonus token run.
    assert proposer.draft_passes[0] == ((12, 2),)
    # Once the sequence is gone, its draft blocks are free again.
    proposer.propose([], [])
    assert proposer.blocks.num_used_blocks == 0


def test_a_long_prompt_catches_up_within_the_token_budget(target_folder, draft_folder):
    engine = engine_with_draft(target_folder, draft_folder, k=2, max_num_batched_tokens=8)
    reference = LLMEngine(EngineConfig(model=draft_folder, device="cpu", kv_cache_memory=1 << 22))
    seq = decoding_seq(list(range(3, 23)))  # 20 tokens unseen by the draft
    proposals = []
    for _ in range(3):
        engine.proposer.propose([seq], [seq])
        proposals.append(list(seq.spec_token_ids))
    assert proposals[:2] == [[], []]  # 8 + 8 tokens caught up, no drafts yet
    assert proposals[2] == greedy_continuation(reference, seq.token_ids, 2)
    assert engine.proposer.draft_passes == (((20, 4),), ((21, 1),))


def test_sampled_requests_keep_the_drafts_distributions(target_folder, draft_folder):
    engine = engine_with_draft(target_folder, draft_folder, k=3)
    params = SamplingParams(max_tokens=10, temperature=0.8, top_k=20, seed=0)
    seq = decoding_seq([5, 9, 14], params)
    engine.proposer.propose([seq], [seq])
    assert len(seq.spec_token_ids) == 3 and seq.spec_probs.shape == (3, VOCAB)
    assert ((seq.spec_probs > 0).sum(dim=-1) <= 20).all()  # top-k applied to the draft too
    probs_of_drafts = seq.spec_probs[torch.arange(3), torch.tensor(seq.spec_token_ids)]
    assert (probs_of_drafts > 0).all()


def test_a_self_draft_reads_the_targets_cache_and_never_catches_up(target_folder):
    engine = engine_with_draft(target_folder, "self:layers=1", k=3)
    proposer = engine.proposer
    assert proposer.shares_target_cache and proposer.kv_cache is engine.kv_cache
    # The reference: the target's first layer alone, decoding greedily from scratch.
    reference = LLMEngine(EngineConfig(model=target_folder, device="cpu", kv_cache_memory=1 << 22))
    reference.model = truncated(reference.model, 1)
    reference.runner = ModelRunner(reference.model, reference.kv_cache)
    engine.add_request([5, 9, 14, 2, 77, 31], GREEDY)
    engine.step()  # the prefill, and token 1: the sequence now decodes
    (seq,) = engine.scheduler.running
    proposer.propose([seq], [seq])
    assert seq.spec_token_ids == greedy_continuation(reference, seq.token_ids, 3)
    # Its last token at position 6 (context 7), then drafts 1 and 2: never the prompt again.
    assert proposer.draft_passes == (((7, 1),), ((8, 1),), ((9, 1),))
