"""A request inside the engine: its tokens, its counters, its blocks, its sampling state."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from llmbench.engine.detokenizer import IncrementalDetokenizer, StopStringMatcher
from llmbench.engine.sampling import SamplingParams


@dataclass(eq=False)
class Sequence:
    """One request. Prefill, chunked prefill, decode and recompute after preemption are all
    `num_tokens - num_computed_tokens` tokens left to run; no mode flag is needed."""

    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    generator: torch.Generator | None
    detokenizer: IncrementalDetokenizer
    stop_matcher: StopStringMatcher
    arrival_ns: int
    token_ids: list[int] = field(default_factory=list)  # prompt + generated so far
    num_computed_tokens: int = 0  # tokens whose K/V are in the cache
    block_table: list[int] = field(default_factory=list)
    prefix_ids: list[int] = field(default_factory=list)  # prefix-cache ids of full blocks
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache on admission
    num_preemptions: int = 0
    first_scheduled_ns: int = 0  # start of the first step that ran it (0: not yet)
    finish_reason: str | None = None
    # Speculative decoding: draft tokens proposed for the next step (not in token_ids until the
    # target accepts them), and the draft's probabilities [len(spec_token_ids), V] they were
    # drawn from (None: each is a point mass, as n-gram and greedy drafts are).
    spec_token_ids: list[int] = field(default_factory=list)
    spec_probs: torch.Tensor | None = None
    num_proposed_tokens: int = 0  # draft tokens verified over the request's life
    num_accepted_tokens: int = 0  # of those, accepted by the target
    num_draft_rejections: int = 0  # verifies that rejected a draft (`draft_budget`)

    def __post_init__(self) -> None:
        if not self.token_ids:
            self.token_ids = list(self.prompt_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_ids)

    @property
    def num_output_tokens(self) -> int:
        return self.num_tokens - self.num_prompt_tokens
