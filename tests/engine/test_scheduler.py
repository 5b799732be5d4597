"""Tests for llmbench.engine.scheduler: token budget, decode-first, chunked prefill, preemption,
prefix hits at admission, finish.

`step` plays the engine: after `schedule()` it moves each sequence's computed counter, registers
the blocks that filled, and appends a token to every sequence whose chunk reached its end.
"""

from __future__ import annotations

import pytest

from llmbench.engine.kv_cache import BlockManager
from llmbench.engine.sampling import SamplingParams
from llmbench.engine.scheduler import Scheduler, SchedulerConfig, SchedulerOutput
from llmbench.engine.sequence import Sequence


def make_seq(request_id: str, prompt_ids: list[int], max_tokens: int = 16) -> Sequence:
    return Sequence(
        request_id=request_id,
        prompt_ids=list(prompt_ids),
        params=SamplingParams(max_tokens=max_tokens),
        generator=None,
        detokenizer=None,
        stop_matcher=None,
        arrival_ns=0,
    )


def make_scheduler(
    max_num_batched_tokens: int = 2048,
    max_num_seqs: int = 64,
    num_blocks: int = 64,
    block_size: int = 4,
    enable_prefix_caching: bool = True,
) -> Scheduler:
    blocks = BlockManager(num_blocks, block_size, enable_prefix_caching)
    return Scheduler(SchedulerConfig(max_num_batched_tokens, max_num_seqs), blocks)


def step(
    scheduler: Scheduler, next_token: int = 100
) -> tuple[SchedulerOutput, list[tuple[str, int, bool]]]:
    """One engine step; every sequence that gets logits samples `next_token`.

    Returns the output and its `summary`, taken before the counters move."""
    out = scheduler.schedule()
    rows = summary(out)
    for item in out.scheduled:
        seq = item.seq
        needs_logits = item.needs_logits  # read before the counter moves
        seq.num_computed_tokens += item.num_new_tokens
        scheduler.blocks.cache_full_blocks(
            seq.block_table, seq.token_ids, seq.num_computed_tokens, seq.prefix_ids
        )
        if needs_logits:
            seq.token_ids.append(next_token)
    return out, rows


def summary(out: SchedulerOutput) -> list[tuple[str, int, bool]]:
    """(request id, tokens scheduled, needs logits) per scheduled sequence, in batch order."""
    return [(item.seq.request_id, item.num_new_tokens, item.needs_logits) for item in out.scheduled]


def finish_done(scheduler: Scheduler) -> None:
    for seq in list(scheduler.running):
        if seq.num_output_tokens >= seq.params.max_tokens:
            scheduler.finish(seq)


# --- budget and max_num_seqs ----------------------------------------------------------------


def test_max_num_seqs_holds_back_a_prompt_the_budget_could_take():
    scheduler = make_scheduler(max_num_batched_tokens=8, max_num_seqs=2)
    a, b, c = (make_seq(name, [1, 2, 3], max_tokens=2) for name in "abc")
    for seq in (a, b, c):
        scheduler.add(seq)
    assert step(scheduler)[1] == [("a", 3, True), ("b", 3, True)]  # 2 tokens unused
    assert list(scheduler.waiting) == [c]
    assert step(scheduler)[1] == [("a", 1, True), ("b", 1, True)]
    finish_done(scheduler)  # a and b reach max_tokens = 2
    assert scheduler.running == []
    assert step(scheduler)[1] == [("c", 3, True)]


def test_budget_stops_admission_mid_prompt():
    scheduler = make_scheduler(max_num_batched_tokens=10)
    for name, length in [("a", 4), ("b", 5), ("c", 6)]:
        scheduler.add(make_seq(name, list(range(length))))
    # a takes 4, b takes 5, c gets the 1 token left; then c's rest after the two decodes.
    assert step(scheduler)[1] == [("a", 4, True), ("b", 5, True), ("c", 1, False)]
    assert step(scheduler)[1] == [("a", 1, True), ("b", 1, True), ("c", 5, True)]
    assert step(scheduler)[1] == [("a", 1, True), ("b", 1, True), ("c", 1, True)]


# Prompt lengths and output lengths of a mixed workload; two pairs share leading tokens.
WORKLOAD = [
    (list(range(1, 6)), 12),
    (list(range(1, 41)), 20),
    (list(range(1, 18)), 1),
    ([7], 30),
    (list(range(100, 164)), 9),
    (list(range(100, 109)), 15),
    (list(range(200, 233)), 25),
    (list(range(1, 13)) + [99] * 7, 10),
]


@pytest.mark.parametrize(
    ("max_num_batched_tokens", "max_num_seqs", "num_blocks", "block_size", "prefix_caching"),
    [
        (2048, 64, 128, 4, True),
        (16, 64, 128, 4, True),
        (7, 3, 128, 4, True),
        (1, 64, 128, 4, True),
        (32, 1, 128, 16, True),
        (16, 8, 20, 4, True),  # tiny caches: preemptions
        (64, 8, 19, 4, False),
        (5, 8, 24, 4, True),
        (33, 5, 40, 2, True),
    ],
)
def test_every_step_respects_budget_and_max_num_seqs(
    max_num_batched_tokens, max_num_seqs, num_blocks, block_size, prefix_caching
):
    scheduler = make_scheduler(
        max_num_batched_tokens, max_num_seqs, num_blocks, block_size, prefix_caching
    )
    seqs = [
        make_seq(f"r{i}", prompt, max_tokens) for i, (prompt, max_tokens) in enumerate(WORKLOAD)
    ]
    for seq in seqs:
        scheduler.add(seq)
    num_steps = 0
    while scheduler.has_unfinished():
        num_steps += 1
        assert num_steps < 2000, "no progress"
        out = scheduler.schedule()
        assert out.scheduled, "a step with unfinished work scheduled nothing"
        assert sum(item.num_new_tokens for item in out.scheduled) <= max_num_batched_tokens
        assert len(out.scheduled) <= max_num_seqs
        assert len(scheduler.running) <= max_num_seqs
        assert len({id(item.seq) for item in out.scheduled}) == len(out.scheduled)
        for item in out.scheduled:
            seq = item.seq
            assert seq in scheduler.running
            assert 1 <= item.num_new_tokens <= seq.num_tokens - seq.num_computed_tokens
            # The table covers every token this step computes.
            num_covered = len(seq.block_table) * block_size
            assert num_covered >= seq.num_computed_tokens + item.num_new_tokens
        for item in out.scheduled:  # play the engine
            seq = item.seq
            needs_logits = item.needs_logits
            seq.num_computed_tokens += item.num_new_tokens
            scheduler.blocks.cache_full_blocks(
                seq.block_table, seq.token_ids, seq.num_computed_tokens, seq.prefix_ids
            )
            if needs_logits:
                seq.token_ids.append(1000 + seq.num_tokens)
        finish_done(scheduler)
    for seq, (prompt, max_tokens) in zip(seqs, WORKLOAD, strict=True):
        assert seq.token_ids[: len(prompt)] == prompt
        assert seq.num_output_tokens == max_tokens
        assert seq.block_table == []
    assert scheduler.blocks.num_free_blocks == num_blocks


# --- decode first -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("budget", "expected_long_chunk"),
    [(16, 14), (3, 1), (2, None), (60, 50)],
)
def test_decodes_go_first_and_a_waiting_prompt_gets_the_rest(budget, expected_long_chunk):
    scheduler = make_scheduler(max_num_batched_tokens=budget)
    a, b = make_seq("a", [1]), make_seq("b", [2])
    scheduler.add(a)
    scheduler.add(b)
    assert step(scheduler)[1] == [("a", 1, True), ("b", 1, True)]
    # Two decodes are running when a 50-token prompt arrives.
    long = make_seq("long", list(range(10, 60)))
    scheduler.add(long)
    expected = [("a", 1, True), ("b", 1, True)]
    if expected_long_chunk is not None:
        expected.append(("long", expected_long_chunk, expected_long_chunk == 50))
    out, rows = step(scheduler)
    assert rows == expected
    assert sum(item.num_new_tokens for item in out.scheduled) == min(budget, 52)
    assert (long in scheduler.running) is (expected_long_chunk is not None)
    assert (long in scheduler.waiting) is (expected_long_chunk is None)


def test_running_prefill_continues_after_the_decodes():
    scheduler = make_scheduler(max_num_batched_tokens=16)
    a, b = make_seq("a", [1, 2, 3, 4]), make_seq("b", [5, 6, 7, 8])
    scheduler.add(a)
    scheduler.add(b)
    step(scheduler)
    scheduler.add(make_seq("long", list(range(10, 60))))
    expected_steps = [
        [("a", 1, True), ("b", 1, True), ("long", 14, False)],  # long: 14 of 50
        [("a", 1, True), ("b", 1, True), ("long", 14, False)],  # 28
        [("a", 1, True), ("b", 1, True), ("long", 14, False)],  # 42
        [("a", 1, True), ("b", 1, True), ("long", 8, True)],  # 50: its first token follows
        [("a", 1, True), ("b", 1, True), ("long", 1, True)],
    ]
    for expected in expected_steps:
        assert step(scheduler)[1] == expected


# --- chunked prefill ----------------------------------------------------------------------


def test_chunked_prefill_splits_a_prompt_exactly():
    scheduler = make_scheduler(max_num_batched_tokens=32, block_size=16)
    seq = make_seq("p", list(range(100)))
    scheduler.add(seq)
    # chunk, needs_logits, num_computed_tokens after, table length after, hashes after, admitted
    expected = [
        (32, False, 32, 2, 2, 100),
        (32, False, 64, 4, 4, 0),
        (32, False, 96, 6, 6, 0),
        (4, True, 100, 7, 6, 0),
        (1, True, 101, 7, 6, 0),  # the first decode
    ]
    for chunk, needs_logits, num_computed, table_len, num_hashes, admitted in expected:
        out, rows = step(scheduler)
        assert rows == [("p", chunk, needs_logits)]
        assert out.num_prompt_tokens_admitted == admitted
        assert out.num_cached_tokens == 0
        assert seq.num_computed_tokens == num_computed
        assert len(seq.block_table) == table_len
        assert len(seq.prefix_ids) == num_hashes
    assert seq.num_output_tokens == 2


# --- preemption ---------------------------------------------------------------------------


def test_newest_running_sequence_is_preempted_and_recomputed_later():
    # 6 blocks of 4 tokens; three 7-token prompts fill all 6 blocks after prefill.
    scheduler = make_scheduler(max_num_batched_tokens=64, num_blocks=6, block_size=4)
    blocks = scheduler.blocks
    a = make_seq("a", [1, 2, 3, 4, 5, 6, 7])
    b = make_seq("b", [11, 12, 13, 14, 15, 16, 17])
    c = make_seq("c", [21, 22, 23, 24, 25, 26, 27])
    for seq in (a, b, c):
        scheduler.add(seq)

    out, rows = step(scheduler, next_token=101)
    assert rows == [("a", 7, True), ("b", 7, True), ("c", 7, True)]
    assert (a.block_table, b.block_table, c.block_table) == ([0, 1], [2, 3], [4, 5])
    assert blocks.num_free_blocks == 0

    out, rows = step(scheduler, next_token=102)  # 8 tokens each: still 2 blocks
    assert rows == [("a", 1, True), ("b", 1, True), ("c", 1, True)]
    assert out.num_preempted == 0

    # 9 tokens each needs a third block, and none is free: c, the newest, gives back its two;
    # a and b take them (c's tail first: least recently freed).
    out, rows = step(scheduler, next_token=103)
    assert out.num_preempted == 1
    assert rows == [("a", 1, True), ("b", 1, True)]
    assert (a.block_table, b.block_table) == ([0, 1, 5], [2, 3, 4])
    assert scheduler.running == [a, b]
    assert list(scheduler.waiting) == [c]
    assert c.block_table == [] and c.prefix_ids == []
    assert c.num_computed_tokens == 0
    assert c.num_preemptions == 1
    assert c.token_ids == [21, 22, 23, 24, 25, 26, 27, 101, 102]  # generated tokens kept
    assert (a.num_preemptions, b.num_preemptions) == (0, 0)

    out, rows = step(scheduler, next_token=104)  # a and b fit in 3 blocks up to 12 tokens
    assert rows == [("a", 1, True), ("b", 1, True)]
    assert out.num_preempted == 0
    assert list(scheduler.waiting) == [c]

    scheduler.finish(a)  # frees 3 blocks: c's 9 tokens fit again
    assert blocks.num_free_blocks == 3
    out, rows = step(scheduler, next_token=105)
    # c re-prefills its 7 prompt tokens and its 2 generated ones in one chunk.
    assert rows == [("b", 1, True), ("c", 9, True)]
    assert out.num_preempted == 0
    assert (out.num_prompt_tokens_admitted, out.num_cached_tokens) == (0, 0)  # not a new prompt
    assert c.num_computed_tokens == 9
    assert c.token_ids == [21, 22, 23, 24, 25, 26, 27, 101, 102, 105]
    assert c.block_table == [5, 1, 0]  # a's uncached tail from the free list, then the LRU
    assert scheduler.running == [b, c]
    assert blocks.num_free_blocks == 0


def test_preemption_puts_the_victim_at_the_front_of_waiting():
    scheduler = make_scheduler(max_num_batched_tokens=64, num_blocks=4, block_size=4)
    a = make_seq("a", [1, 2, 3, 4, 5, 6, 7])
    b = make_seq("b", [11, 12, 13, 14, 15, 16, 17])
    late = make_seq("late", [31, 32, 33])
    scheduler.add(a)
    scheduler.add(b)
    step(scheduler)
    step(scheduler)
    scheduler.add(late)  # waits: no free block
    assert list(scheduler.waiting) == [late]
    out, rows = step(scheduler)  # a needs a third block: b goes back, ahead of `late`
    assert out.num_preempted == 1
    assert rows == [("a", 1, True)]
    assert list(scheduler.waiting) == [b, late]


def test_a_lone_sequence_outgrowing_the_cache_preempts_itself():
    scheduler = make_scheduler(max_num_batched_tokens=64, num_blocks=2, block_size=4)
    seq = make_seq("a", list(range(8)))
    scheduler.add(seq)
    assert step(scheduler)[1] == [("a", 8, True)]
    out, rows = step(scheduler)  # 9 tokens need 3 blocks of a pool of 2
    assert out.scheduled == []
    assert out.num_preempted == 1
    assert scheduler.running == []
    assert list(scheduler.waiting) == [seq]
    assert (seq.num_computed_tokens, seq.num_preemptions, seq.block_table) == (0, 1, [])
    assert scheduler.blocks.num_free_blocks == 2


# --- prefix hits at admission -------------------------------------------------------------


def finished_first_sequence(scheduler: Scheduler) -> list[int]:
    """Run a 10-token prompt [1..10] (2 full blocks of 4 + 2) to its first token, finish it, and
    return its block table from before the finish."""
    first = make_seq("first", list(range(1, 11)), max_tokens=1)
    scheduler.add(first)
    out, rows = step(scheduler)
    assert rows == [("first", 10, True)]
    assert (out.num_prompt_tokens_admitted, out.num_cached_tokens) == (10, 0)
    table = list(first.block_table)
    assert len(first.prefix_ids) == (2 if scheduler.blocks.enable_prefix_caching else 0)
    finish_done(scheduler)
    assert first.block_table == []
    return table


def test_admission_starts_past_the_cached_prefix():
    scheduler = make_scheduler()
    first_table = finished_first_sequence(scheduler)
    assert first_table == [0, 1, 2]
    second = make_seq("second", list(range(1, 9)) + [50, 51, 52, 53, 54])  # 13 tokens
    other = make_seq("other", [60, 61, 62, 63, 64, 65])  # no hit
    scheduler.add(second)
    scheduler.add(other)
    out = scheduler.schedule()
    assert summary(out) == [("second", 5, True), ("other", 6, True)]
    assert second.num_computed_tokens == 8
    assert second.num_cached_tokens == 8
    assert other.num_cached_tokens == 0
    assert second.block_table[:2] == first_table[:2]
    assert len(second.block_table) == 4
    assert second.prefix_ids == scheduler.blocks.match_prefix(second.token_ids, 8).prefix_ids
    assert out.num_prompt_tokens_admitted == 13 + 6
    assert out.num_cached_tokens == 8
    assert [scheduler.blocks.ref_count(b) for b in first_table[:2]] == [1, 1]


def test_a_running_owner_and_a_new_sequence_share_blocks():
    scheduler = make_scheduler()
    first = make_seq("first", list(range(1, 11)))
    scheduler.add(first)
    step(scheduler)
    second = make_seq("second", list(range(1, 9)) + [70])
    scheduler.add(second)
    out, rows = step(scheduler)
    assert rows == [("first", 1, True), ("second", 1, True)]
    assert (out.num_prompt_tokens_admitted, out.num_cached_tokens) == (9, 8)
    assert second.block_table[:2] == first.block_table[:2]
    assert [scheduler.blocks.ref_count(b) for b in first.block_table[:2]] == [2, 2]


# Prompt = the first `length` tokens of [1..12] (the first sequence cached blocks [1..4] and
# [5..8]); match_prefix gets max_tokens = length - 1, so a prompt of exactly k full cached blocks
# reuses only k - 1 of them and recomputes the last to get its logits.
@pytest.mark.parametrize(
    ("length", "num_cached"),
    [(1, 0), (3, 0), (4, 0), (5, 4), (7, 4), (8, 4), (9, 8), (10, 8), (12, 8)],
)
def test_prefix_hit_leaves_at_least_the_last_token_to_compute(length, num_cached):
    scheduler = make_scheduler()
    first_table = finished_first_sequence(scheduler)
    seq = make_seq("s", list(range(1, length + 1)))
    scheduler.add(seq)
    out = scheduler.schedule()
    assert summary(out) == [("s", length - num_cached, True)]
    assert seq.num_computed_tokens == seq.num_cached_tokens == num_cached
    assert (out.num_prompt_tokens_admitted, out.num_cached_tokens) == (length, num_cached)
    num_shared = num_cached // 4
    assert seq.block_table[:num_shared] == first_table[:num_shared]
    assert not set(seq.block_table[num_shared:]) & set(first_table[:2])
    assert len(seq.block_table) == -(-length // 4)


def test_a_difference_in_the_first_block_means_no_hit():
    scheduler = make_scheduler()
    finished_first_sequence(scheduler)
    seq = make_seq("s", [99] + list(range(2, 13)))  # blocks 1 and 2 equal the first's, not 0
    scheduler.add(seq)
    out = scheduler.schedule()
    assert summary(out) == [("s", 12, True)]
    assert (out.num_prompt_tokens_admitted, out.num_cached_tokens) == (12, 0)
    assert seq.num_cached_tokens == 0


def test_no_hits_without_prefix_caching():
    scheduler = make_scheduler(enable_prefix_caching=False)
    finished_first_sequence(scheduler)
    seq = make_seq("s", list(range(1, 11)))
    scheduler.add(seq)
    out = scheduler.schedule()
    assert summary(out) == [("s", 10, True)]
    assert (out.num_prompt_tokens_admitted, out.num_cached_tokens) == (10, 0)


def test_readmission_after_preemption_keeps_the_first_admission_counts():
    # The first sequence caches [1..4], [5..8]; the victim shares them, so it is admitted with 8
    # cached tokens, then preempted, then readmitted: neither count is taken again.
    scheduler = make_scheduler(max_num_batched_tokens=64, num_blocks=6, block_size=4)
    finished_first_sequence(scheduler)
    a = make_seq("a", [31, 32, 33, 34, 35, 36, 37])
    victim = make_seq("victim", list(range(1, 9)) + [40, 41, 42])  # 11 tokens
    scheduler.add(a)
    scheduler.add(victim)
    out, rows = step(scheduler)
    assert rows == [("a", 7, True), ("victim", 3, True)]
    assert (out.num_prompt_tokens_admitted, out.num_cached_tokens) == (7 + 11, 8)
    assert victim.num_cached_tokens == 8
    assert scheduler.blocks.num_free_blocks == 1  # 2 (a) + 3 (victim) in use
    step(scheduler)  # a: 8 tokens, victim: 12 tokens, both still fit
    # a needs a third block (1 is free), then the victim a fourth (none left): preempted.
    out, rows = step(scheduler)
    assert out.num_preempted == 1
    assert rows == [("a", 1, True)]
    assert victim.num_preemptions == 1
    assert victim.num_cached_tokens == 8
    scheduler.finish(a)
    out = scheduler.schedule()
    assert out.num_preempted == 0
    # Its own blocks [1..8] and [40, 41, 42, first token] are still cached: 12 of 13 are hits.
    assert summary(out) == [("victim", 1, True)]
    assert victim.num_computed_tokens == 12
    assert (out.num_prompt_tokens_admitted, out.num_cached_tokens) == (0, 0)
    assert victim.num_cached_tokens == 8


# --- finish -------------------------------------------------------------------------------


def test_finish_removes_running_and_waiting_sequences_and_frees_their_blocks():
    scheduler = make_scheduler(max_num_batched_tokens=64, max_num_seqs=2, num_blocks=8)
    a, b, c = make_seq("a", list(range(9))), make_seq("b", [1, 2]), make_seq("c", [3])
    for seq in (a, b, c):
        scheduler.add(seq)
    step(scheduler)
    assert scheduler.running == [a, b]
    assert list(scheduler.waiting) == [c]
    assert scheduler.blocks.num_free_blocks == 8 - 3 - 1

    scheduler.finish(a)
    assert scheduler.running == [b]
    assert a.block_table == []
    assert scheduler.blocks.num_free_blocks == 8 - 1

    scheduler.finish(c)  # still waiting, holds no block
    assert list(scheduler.waiting) == []
    assert scheduler.blocks.num_free_blocks == 8 - 1

    scheduler.finish(b)
    assert scheduler.running == []
    assert not scheduler.has_unfinished()
    assert scheduler.blocks.num_free_blocks == 8
    assert scheduler.schedule().scheduled == []


# --- speculative decoding: draft tokens verified as extra query rows ----------------------------


def decoding_seq(scheduler: Scheduler, request_id: str, prompt: list[int]) -> Sequence:
    """A sequence admitted and prefilled alone, now with one token left (decoding)."""
    seq = make_seq(request_id, prompt, max_tokens=32)
    scheduler.add(seq)
    step(scheduler)
    assert seq.num_tokens - seq.num_computed_tokens == 1
    return seq


def test_a_decoding_sequence_runs_its_drafts_after_its_last_token():
    scheduler = make_scheduler(block_size=4)
    seq = decoding_seq(scheduler, "a", [1, 2, 3])  # 4 tokens, 3 computed
    seq.spec_token_ids = [7, 8, 9]
    out = scheduler.schedule()
    (item,) = out.scheduled
    assert (item.num_new_tokens, item.spec_token_ids, item.needs_logits) == (4, (7, 8, 9), True)
    # Slots for 3 computed + 1 last token + 3 drafts = 7 tokens: 2 blocks of 4.
    assert len(seq.block_table) == 2


@pytest.mark.parametrize(
    ("budget", "expected"),
    [
        (8, [("a", 4, (7, 8, 9)), ("b", 4, (5, 6, 4))]),  # both fit whole
        (6, [("a", 4, (7, 8, 9)), ("b", 2, (5,))]),  # b verifies what is left: 1 draft
        (5, [("a", 4, (7, 8, 9)), ("b", 1, ())]),  # b decodes plainly
        (3, [("a", 3, (7, 8))]),  # a is cut to 2 drafts; nothing is left for b
    ],
)
def test_drafts_take_what_the_token_budget_leaves(budget, expected):
    scheduler = make_scheduler(max_num_batched_tokens=budget)
    a = decoding_seq(scheduler, "a", [1, 2, 3])
    b = decoding_seq(scheduler, "b", [1, 2])
    a.spec_token_ids, b.spec_token_ids = [7, 8, 9], [5, 6, 4]
    out = scheduler.schedule()
    assert [(i.seq.request_id, i.num_new_tokens, i.spec_token_ids) for i in out.scheduled] == (
        expected
    )


def test_drafts_are_dropped_before_anyone_is_preempted():
    # 3 blocks of 4: a holds 1 (3 tokens), b holds 1 (2 tokens); one block is free.
    scheduler = make_scheduler(num_blocks=3, block_size=4)
    a = decoding_seq(scheduler, "a", [1, 2, 3])  # 4 tokens: its block is full
    decoding_seq(scheduler, "b", [5, 6])
    a.spec_token_ids = [7, 8, 9, 10, 11]  # 3 + 1 + 5 = 9 tokens: 3 blocks, 2 more than a has
    out = scheduler.schedule()
    assert summary(out) == [("a", 1, True), ("b", 1, True)]
    assert out.num_preempted == 0 and all(not i.spec_token_ids for i in out.scheduled)


def test_a_prefilling_sequence_ignores_drafts():
    scheduler = make_scheduler(max_num_batched_tokens=2)
    seq = make_seq("a", [1, 2, 3, 4, 5])
    scheduler.add(seq)
    seq.spec_token_ids = [9]  # stale: it still has 5 prompt tokens to run
    out = scheduler.schedule()
    assert summary(out) == [("a", 2, False)] and out.scheduled[0].spec_token_ids == ()
