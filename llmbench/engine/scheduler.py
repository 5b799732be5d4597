"""Which sequences run in the next step, and how many of their tokens.

Counters, not modes: every sequence has `num_tokens` and `num_computed_tokens`, and the step
runs up to their difference. Running sequences go first (a decode is one token), then waiting
ones are admitted with what is left of the token budget, so long prompts are prefilled in
chunks; a waiting sequence starts past the leading blocks the prefix cache already holds. When
the cache has no free block, the newest running sequence is preempted: its blocks are freed and
it is recomputed later (its generated tokens become part of what it re-prefills).

Speculative decoding adds no mode either: a decoding sequence that carries draft tokens
(`spec_token_ids`) runs them after its last token, k + 1 query rows, as far as the token budget
allows; when the cache is short, the drafts are dropped before any sequence is preempted.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from llmbench.engine.kv_cache import BlockManager
from llmbench.engine.sequence import Sequence


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_batched_tokens: int = 2048  # tokens per step, prefill chunks + decodes
    max_num_seqs: int = 64  # sequences per step


@dataclass(frozen=True)
class ScheduledSeq:
    seq: Sequence
    num_new_tokens: int  # query rows this step: tokens to compute, then the drafts to verify
    spec_token_ids: tuple[int, ...] = ()  # draft tokens verified after the sequence's last token

    @property
    def needs_logits(self) -> bool:
        """True when this chunk reaches the end of the sequence: a new token follows it."""
        num_known = self.num_new_tokens - len(self.spec_token_ids)
        return self.seq.num_computed_tokens + num_known == self.seq.num_tokens


@dataclass(frozen=True)
class SchedulerOutput:
    scheduled: list[ScheduledSeq]
    num_preempted: int
    num_prompt_tokens_admitted: int  # prompts of requests admitted for the first time
    num_cached_tokens: int  # of those, tokens found in the prefix cache


class Scheduler:
    def __init__(self, config: SchedulerConfig, blocks: BlockManager):
        self.config = config
        self.blocks = blocks
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> SchedulerOutput:
        budget = self.config.max_num_batched_tokens
        scheduled: dict[Sequence, int] = {}  # insertion-ordered: the batch order
        drafts: dict[Sequence, tuple[int, ...]] = {}  # draft tokens each one verifies
        num_preempted = 0
        # Decodes (one token left) before running prefill chunks; stable, so FIFO within each.
        for seq in sorted(self.running, key=lambda s: s.num_tokens - s.num_computed_tokens > 1):
            if seq not in self.running:
                continue  # preempted earlier in this loop
            n = min(seq.num_tokens - seq.num_computed_tokens, budget)
            if n == 0:
                continue
            is_decode = seq.num_tokens - seq.num_computed_tokens == 1
            num_spec = min(len(seq.spec_token_ids), budget - n) if is_decode else 0
            while not self.blocks.can_allocate(
                seq.block_table, seq.num_computed_tokens + n + num_spec
            ):
                if num_spec:
                    num_spec = 0  # drop the drafts before preempting anyone
                    continue
                victim = self.running[-1]  # the newest; possibly seq itself
                budget += scheduled.pop(victim, 0)
                drafts.pop(victim, None)
                self._preempt(victim)
                num_preempted += 1
                if victim is seq:
                    break
            if seq not in self.running:
                continue
            self.blocks.allocate(seq.block_table, seq.num_computed_tokens + n + num_spec)
            scheduled[seq] = n + num_spec
            if num_spec:
                drafts[seq] = tuple(seq.spec_token_ids[:num_spec])
            budget -= n + num_spec
        num_admitted = num_cached = 0
        bs = self.blocks.block_size
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            seq = self.waiting[0]
            # Leave at least the last token to compute: its logits give the next token.
            prefix = self.blocks.match_prefix(seq.token_ids, seq.num_tokens - 1)
            computed = prefix.num_tokens(bs)
            n = min(seq.num_tokens - computed, budget)
            if not self.blocks.can_allocate(seq.block_table, computed + n, prefix):
                break
            self.waiting.popleft()
            self.blocks.allocate(seq.block_table, computed + n, prefix)
            seq.prefix_ids = list(prefix.prefix_ids)
            seq.num_computed_tokens = computed
            if seq.num_preemptions == 0:
                seq.num_cached_tokens = computed
                num_admitted += seq.num_prompt_tokens
                num_cached += computed
            self.running.append(seq)
            scheduled[seq] = n
            budget -= n
        return SchedulerOutput(
            [ScheduledSeq(s, n, drafts.get(s, ())) for s, n in scheduled.items()],
            num_preempted,
            num_admitted,
            num_cached,
        )

    def _preempt(self, seq: Sequence) -> None:
        """Free a sequence's blocks and queue it first in line to be recomputed."""
        self.running.remove(seq)
        self.blocks.free(seq.block_table)
        seq.num_computed_tokens = 0
        seq.prefix_ids = []
        seq.num_preemptions += 1
        self.waiting.appendleft(seq)

    def finish(self, seq: Sequence) -> None:
        """Remove a finished or aborted sequence and release its blocks."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.blocks.free(seq.block_table)
