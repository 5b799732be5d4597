"""Which proposer a `SpeculativeConfig` asks for: n-gram lookup or a draft model (None: off).

Its own module so that `speculative` (the proposer protocol, n-gram proposals) and
`draft_model` (which builds on that protocol) do not import each other."""

from __future__ import annotations

from llmbench.engine.draft_model import DraftModelProposer
from llmbench.engine.speculative import NgramProposer, Proposer, SpeculativeConfig


def make_proposer(
    config: SpeculativeConfig,
    target,
    tokenizer,
    target_name: str,
    kv_cache,
    blocks,
    max_num_batched_tokens: int,
) -> Proposer | None:
    """The proposer `config` asks for (None: speculation off). A draft model is loaded like the
    `target` (named `target_name`); a `self:` draft reads and writes the target's `kv_cache`
    through its `blocks`, any other gets a cache of as many blocks and catches up at most
    `max_num_batched_tokens` tokens a step."""
    if config.method == "ngram":
        return NgramProposer(config)
    if config.method == "draft":
        return DraftModelProposer.open(
            config,
            target,
            tokenizer,
            target_name,
            kv_cache,
            blocks,
            max_num_batched_tokens,
        )
    return None
