"""Tests for llmbench.engine.kv_cache: block allocation, ref counts, the prefix cache, the LRU.

Block ids are predictable: a fresh manager hands out 0, 1, 2, ... from its free list, a freed
block that holds no cached content goes to the back of that list, and a freed cached block goes
to the back of the LRU (the tail of a table first). So the tests assert exact ids, not just counts.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmbench.engine import kv_cache
from llmbench.engine.kv_cache import BlockManager, PrefixMatch, blocks_for


def computed(bm: BlockManager, token_ids: list[int], prefix: PrefixMatch | None = None):
    """Allocate a table for token_ids (after `prefix`), then mark all of them computed so their
    full blocks enter the prefix cache, as the engine does after a step. Returns (table, hashes)."""
    table: list[int] = []
    bm.allocate(table, len(token_ids), prefix)
    hashes = list(prefix.prefix_ids) if prefix else []
    bm.cache_full_blocks(table, token_ids, len(token_ids), hashes)
    return table, hashes


def ref_counts(bm: BlockManager) -> list[int]:
    return [bm.ref_count(b) for b in range(bm.num_blocks)]


# --- blocks_for, construction -------------------------------------------------------------


@pytest.mark.parametrize(
    ("num_tokens", "block_size", "expected"),
    [
        (0, 16, 0),
        (1, 16, 1),
        (15, 16, 1),
        (16, 16, 1),
        (17, 16, 2),
        (48, 16, 3),
        (49, 16, 4),
        (5, 1, 5),
        (7, 4, 2),
        (8, 4, 2),
        (9, 4, 3),
    ],
)
def test_blocks_for_is_ceil_division(num_tokens, block_size, expected):
    assert blocks_for(num_tokens, block_size) == expected


@pytest.mark.parametrize(
    ("bytes_per_token", "expected_blocks"),
    [
        (46_080, 2_912),  # SmolLM2 K/V in float32: 2 GiB / (46,080 B · 16) = 2,912.7
        (23_040, 5_825),  # bfloat16: twice the tokens (one block more: 5,825.4)
        (11_880, 11_297),  # int8 + float16 scales: 3.88x float32 (11,297.8)
        (6_120, 21_931),  # int4 + float16 scales: 7.53x float32 (21,931.0)
    ],
)
def test_blocks_in_budget_scales_inversely_with_bytes_per_token(bytes_per_token, expected_blocks):
    assert kv_cache.blocks_in_budget(2 * 1024**3, bytes_per_token, 16) == expected_blocks


def test_blocks_in_budget_counts_whole_blocks_only():
    assert kv_cache.blocks_in_budget(16 * 100 - 1, 100, 16) == 0
    assert kv_cache.blocks_in_budget(16 * 100, 100, 16) == 1
    assert kv_cache.blocks_in_budget(3.5 * 16 * 100, 100, 16) == 3


@pytest.mark.parametrize(("num_blocks", "block_size"), [(0, 16), (8, 0), (-1, 16), (8, -4)])
def test_block_manager_rejects_non_positive_sizes(num_blocks, block_size):
    with pytest.raises(ValueError, match="num_blocks, block_size > 0"):
        BlockManager(num_blocks, block_size)


def test_fresh_manager_has_every_block_free():
    bm = BlockManager(num_blocks=10, block_size=16)
    assert (bm.num_free_blocks, bm.num_used_blocks) == (10, 0)
    assert ref_counts(bm) == [0] * 10


# --- allocate / blocks_needed / can_allocate / free ---------------------------------------


# One table grown step by step (block_size 4, 8 blocks): num_tokens → table after, free after.
GROWTH = [
    (1, [0], 7),
    (4, [0], 7),
    (5, [0, 1], 6),
    (8, [0, 1], 6),
    (13, [0, 1, 2, 3], 4),
    (13, [0, 1, 2, 3], 4),  # same size again: nothing new
    (2, [0, 1, 2, 3], 4),  # a smaller size never shrinks a table
    (32, [0, 1, 2, 3, 4, 5, 6, 7], 0),
]


def test_allocate_grows_a_table_to_ceil_tokens_over_block_size():
    bm = BlockManager(num_blocks=8, block_size=4)
    table: list[int] = []
    for num_tokens, expected_table, expected_free in GROWTH:
        bm.allocate(table, num_tokens)
        assert table == expected_table, num_tokens
        assert bm.num_free_blocks == expected_free, num_tokens
        assert bm.num_used_blocks == 8 - expected_free, num_tokens
        assert all(bm.ref_count(b) == 1 for b in table)


@pytest.mark.parametrize(
    ("table_len", "num_tokens", "expected"),
    [
        (0, 0, 0),
        (0, 1, 1),
        (0, 4, 1),
        (0, 5, 2),
        (1, 4, 0),
        (1, 5, 1),
        (2, 17, 3),
        (3, 5, 0),  # a table larger than needed never gives a negative count
    ],
)
def test_blocks_needed(table_len, num_tokens, expected):
    bm = BlockManager(num_blocks=16, block_size=4)
    table: list[int] = []
    bm.allocate(table, table_len * 4)
    assert len(table) == table_len
    assert bm.blocks_needed(table, num_tokens) == expected


@pytest.mark.parametrize(
    ("held_tokens", "table_tokens", "num_tokens", "expected"),
    [
        # 4 blocks of 4 tokens; another sequence holds `held_tokens`; the table under test
        # already covers `table_tokens`.
        (0, 0, 16, True),
        (0, 0, 17, False),
        (12, 0, 4, True),
        (12, 0, 5, False),
        (8, 4, 8, True),  # 2 held + 1 owned + 1 new = 4
        (8, 4, 9, False),  # would need 2 new
        (16, 0, 0, True),  # nothing new needed, even with no free block
        (12, 4, 4, True),
    ],
)
def test_can_allocate(held_tokens, table_tokens, num_tokens, expected):
    bm = BlockManager(num_blocks=4, block_size=4)
    other: list[int] = []
    bm.allocate(other, held_tokens)
    table: list[int] = []
    bm.allocate(table, table_tokens)
    assert bm.can_allocate(table, num_tokens) is expected


def test_over_allocation_raises_memory_error_and_changes_nothing():
    bm = BlockManager(num_blocks=4, block_size=4)
    table: list[int] = []
    bm.allocate(table, 8)
    with pytest.raises(MemoryError, match="not enough free blocks for 17 tokens"):
        bm.allocate(table, 17)  # needs 5 blocks, the pool has 4
    assert table == [0, 1]
    assert bm.num_free_blocks == 2
    assert ref_counts(bm) == [1, 1, 0, 0]


def test_free_returns_blocks_and_empties_the_table():
    bm = BlockManager(num_blocks=6, block_size=4)
    a: list[int] = []
    b: list[int] = []
    bm.allocate(a, 9)  # [0, 1, 2]
    bm.allocate(b, 4)  # [3]
    assert (bm.num_free_blocks, bm.num_used_blocks) == (2, 4)
    bm.free(a)
    assert a == []
    assert (bm.num_free_blocks, bm.num_used_blocks) == (5, 1)
    assert ref_counts(bm) == [0, 0, 0, 1, 0, 0]
    # Free list order: 4, 5 were never used, then a's blocks tail first: 2, 1, 0.
    c: list[int] = []
    bm.allocate(c, 20)
    assert c == [4, 5, 2, 1, 0]
    assert bm.num_free_blocks == 0


def test_double_free_raises():
    bm = BlockManager(num_blocks=4, block_size=4)
    table: list[int] = []
    bm.allocate(table, 8)
    copy = list(table)
    bm.free(table)
    with pytest.raises(AssertionError, match="freed more often than allocated"):
        bm.free(copy)
    assert ref_counts(bm) == [0, 0, 0, 0]
    assert bm.num_free_blocks == 4


def test_freeing_a_block_never_allocated_raises():
    bm = BlockManager(num_blocks=4, block_size=4)
    with pytest.raises(AssertionError, match="block 2 freed more often"):
        bm.free([2])
    assert ref_counts(bm) == [0, 0, 0, 0]


# --- prefix caching -------------------------------------------------------------------------

BS = 16
SEQ_A = list(range(1000, 1056))  # 56 tokens: 3 full blocks of 16 + 8
SEQ_B = SEQ_A[:48] + list(range(2000, 2010))  # 58 tokens: A's 3 full blocks, then its own


def test_cache_full_blocks_registers_only_full_blocks():
    bm = BlockManager(num_blocks=16, block_size=BS)
    table, hashes = computed(bm, SEQ_A)
    assert table == [0, 1, 2, 3]
    assert len(hashes) == 3  # the 8-token tail block is not cached
    # Each registered block gets a fresh prefix id naming its whole token prefix.
    assert len(set(hashes)) == 3 and kv_cache.ROOT_PREFIX_ID not in hashes


def test_shared_prefix_matches_the_same_blocks_in_order():
    bm = BlockManager(num_blocks=16, block_size=BS)
    table_a, hashes_a = computed(bm, SEQ_A)
    match = bm.match_prefix(SEQ_B, len(SEQ_B))
    assert match.block_ids == table_a[:3] == [0, 1, 2]
    assert match.prefix_ids == hashes_a
    assert match.num_tokens(BS) == 48
    # Looking acquires nothing.
    assert ref_counts(bm)[:4] == [1, 1, 1, 1]
    assert bm.num_free_blocks == 12


@pytest.mark.parametrize(
    ("max_tokens", "num_blocks_matched"),
    [(0, 0), (15, 0), (16, 1), (31, 1), (32, 2), (47, 2), (48, 3), (57, 3), (1000, 3)],
)
def test_match_prefix_max_tokens_caps_the_match(max_tokens, num_blocks_matched):
    bm = BlockManager(num_blocks=16, block_size=BS)
    computed(bm, SEQ_A)
    match = bm.match_prefix(SEQ_B, max_tokens)
    assert match.block_ids == [0, 1, 2][:num_blocks_matched]
    assert len(match.prefix_ids) == num_blocks_matched


def test_partial_last_block_is_never_matched_until_it_is_full():
    bm = BlockManager(num_blocks=16, block_size=BS)
    table, hashes = computed(bm, SEQ_A)  # block 3 holds 8 of 16 tokens
    grown = SEQ_A + list(range(1056, 1064))  # the same 56 tokens, then 8 more: 64 = 4 blocks
    assert bm.match_prefix(SEQ_A, len(SEQ_A)).block_ids == [0, 1, 2]
    assert bm.match_prefix(grown, len(grown)).block_ids == [0, 1, 2]
    # Once A itself computes those 8 tokens, block 3 is full and joins the cache.
    bm.allocate(table, len(grown))
    bm.cache_full_blocks(table, grown, len(grown), hashes)
    assert len(hashes) == 4
    assert bm.match_prefix(grown, len(grown)).block_ids == [0, 1, 2, 3]
    # A query that only shares part of block 3 still stops at block 2.
    assert bm.match_prefix(grown[:60] + [0, 0, 0, 0], 64).block_ids == [0, 1, 2]


@pytest.mark.parametrize(
    ("changed_position", "num_blocks_matched"),
    [(0, 0), (15, 0), (16, 1), (31, 1), (32, 2), (47, 2), (None, 3)],
)
def test_a_difference_breaks_the_chain_from_its_block_on(changed_position, num_blocks_matched):
    """Block 2's tokens are identical whenever position < 32 changes, but its parent differs."""
    bm = BlockManager(num_blocks=16, block_size=BS)
    computed(bm, SEQ_A)
    query = SEQ_A[:48]
    if changed_position is not None:
        query[changed_position] = -1
    assert bm.match_prefix(query, 48).block_ids == [0, 1, 2][:num_blocks_matched]


def test_sharing_raises_ref_counts_and_freeing_one_owner_keeps_blocks():
    bm = BlockManager(num_blocks=8, block_size=BS)
    table_a, _ = computed(bm, SEQ_A)  # [0, 1, 2, 3]
    match = bm.match_prefix(SEQ_B, len(SEQ_B))
    assert bm.can_allocate([], len(SEQ_B), match)
    table_b, hashes_b = computed(bm, SEQ_B, match)
    assert table_b == [0, 1, 2, 4]  # 58 tokens = 4 blocks: 3 shared + 1 new
    assert len(hashes_b) == 3
    assert ref_counts(bm) == [2, 2, 2, 1, 1, 0, 0, 0]
    assert (bm.num_used_blocks, bm.num_free_blocks) == (5, 3)

    bm.free(table_a)
    assert ref_counts(bm) == [1, 1, 1, 0, 1, 0, 0, 0]
    assert (bm.num_used_blocks, bm.num_free_blocks) == (4, 4)  # only A's tail came back
    assert bm.match_prefix(SEQ_A, 56).block_ids == [0, 1, 2]

    bm.free(table_b)
    assert ref_counts(bm) == [0] * 8
    assert (bm.num_used_blocks, bm.num_free_blocks) == (0, 8)  # cached, unused, counted free
    assert bm.match_prefix(SEQ_A, 56).block_ids == [0, 1, 2]  # and still findable


def test_allocating_a_cached_prefix_back_from_the_lru():
    bm = BlockManager(num_blocks=8, block_size=BS)
    table_a, _ = computed(bm, SEQ_A)
    bm.free(table_a)
    match = bm.match_prefix(SEQ_B, len(SEQ_B))
    table_b, _ = computed(bm, SEQ_B, match)
    # 4, 5, 6, 7 were never used, so the first truly free block is 4; A's tail 3 went behind.
    assert table_b == [0, 1, 2, 4]
    assert ref_counts(bm) == [1, 1, 1, 0, 1, 0, 0, 0]
    assert bm.num_free_blocks == 4


# Block size 4, 5 blocks. A = blocks [0, 1], B = blocks [2, 3], both fully cached; block 4 is
# free. B is freed first, then A, so the LRU holds (least recently freed first) 3, 2, 1, 0.
# Each row: one more 4-token allocation → the block it takes, then how many blocks of A and of B
# can still be matched.
EVICTIONS = [
    (4, 2, 2),  # the free list goes first: cached contents are kept as long as possible
    (3, 2, 1),  # B's tail (freed first, being the tail of the table freed first)
    (2, 2, 0),
    (1, 1, 0),
    (0, 0, 0),
]


def test_eviction_takes_the_least_recently_freed_cached_block_first():
    bm = BlockManager(num_blocks=5, block_size=4)
    tokens_a = [1, 2, 3, 4, 5, 6, 7, 8]
    tokens_b = [9, 10, 11, 12, 13, 14, 15, 16]
    table_a, _ = computed(bm, tokens_a)
    table_b, _ = computed(bm, tokens_b)
    assert (table_a, table_b) == ([0, 1], [2, 3])
    bm.free(table_b)
    bm.free(table_a)
    assert bm.num_free_blocks == 5
    for taken, num_a, num_b in EVICTIONS:
        table: list[int] = []
        bm.allocate(table, 4)
        assert table == [taken]
        assert len(bm.match_prefix(tokens_a, 8).block_ids) == num_a, taken
        assert len(bm.match_prefix(tokens_b, 8).block_ids) == num_b, taken
    assert bm.num_free_blocks == 0
    with pytest.raises(MemoryError):
        bm.allocate([], 1)


def test_reacquiring_cached_blocks_makes_them_most_recently_freed():
    bm = BlockManager(num_blocks=4, block_size=4)
    tokens_a = [1, 2, 3, 4, 5, 6, 7, 8]
    tokens_b = [9, 10, 11, 12, 13, 14, 15, 16]
    table_a, _ = computed(bm, tokens_a)
    table_b, _ = computed(bm, tokens_b)
    bm.free(table_a)
    bm.free(table_b)  # LRU: 1, 0, 3, 2
    again, _ = computed(bm, tokens_a, bm.match_prefix(tokens_a, 8))
    assert again == [0, 1]
    bm.free(again)  # LRU: 3, 2, 1, 0
    table: list[int] = []
    bm.allocate(table, 8)
    assert table == [3, 2]  # B's blocks, now the least recently freed
    assert bm.match_prefix(tokens_b, 8).block_ids == []
    assert bm.match_prefix(tokens_a, 8).block_ids == [0, 1]


def test_evicted_block_reused_for_other_content_matches_only_that_content():
    bm = BlockManager(num_blocks=1, block_size=4)
    old, _ = computed(bm, [1, 2, 3, 4])
    bm.free(old)
    new, _ = computed(bm, [5, 6, 7, 8])  # evicts block 0 and refills it
    assert new == [0]
    assert bm.match_prefix([1, 2, 3, 4], 4).block_ids == []
    assert bm.match_prefix([5, 6, 7, 8], 4).block_ids == [0]


def test_can_allocate_counts_unused_cached_prefix_blocks_as_consumed():
    """Acquiring a cached block that sits in the LRU takes it out of the free count."""
    bm = BlockManager(num_blocks=4, block_size=4)
    tokens_a = [1, 2, 3, 4, 5, 6, 7, 8]
    table_a, _ = computed(bm, tokens_a)  # [0, 1]
    bm.free(table_a)  # LRU: 1, 0; free list: 2, 3
    query = tokens_a + [20, 21, 22, 23]  # 12 tokens = 2 cached blocks + 1 new
    match = bm.match_prefix(query, 11)
    assert match.block_ids == [0, 1]
    assert bm.can_allocate([], 12, match)  # 1 new + 2 from the LRU = 3 <= 4

    other: list[int] = []
    bm.allocate(other, 8)  # takes 2, 3 from the free list; the LRU blocks stay cached
    assert other == [2, 3]
    assert bm.num_free_blocks == 2
    assert bm.match_prefix(query, 11).block_ids == [0, 1]
    assert not bm.can_allocate([], 12, match)  # 1 + 2 = 3 > 2
    with pytest.raises(MemoryError):
        bm.allocate([], 12, match)
    assert ref_counts(bm) == [0, 0, 1, 1]
    assert bm.can_allocate([], 8, match)  # the 2 cached blocks alone: 2 <= 2
    table: list[int] = []
    bm.allocate(table, 8, match)
    assert table == [0, 1]
    assert bm.num_free_blocks == 0


def test_prefix_blocks_held_by_another_sequence_cost_no_free_block():
    bm = BlockManager(num_blocks=4, block_size=4)
    tokens_a = [1, 2, 3, 4, 5, 6, 7, 8]
    table_a, _ = computed(bm, tokens_a)  # [0, 1], still held
    query = tokens_a + [20, 21, 22, 23, 24, 25, 26, 27]  # 16 tokens: 2 shared + 2 new
    match = bm.match_prefix(query, 15)
    assert match.block_ids == [0, 1]
    assert bm.num_free_blocks == 2
    assert bm.can_allocate([], 16, match)
    assert not bm.can_allocate([], 17, match)
    table, _ = computed(bm, query, match)
    assert table == [0, 1, 2, 3]
    assert ref_counts(bm) == [2, 2, 1, 1]
    assert table_a == [0, 1]


# --- hash collisions ------------------------------------------------------------------------


class CollidingToken(int):
    """A token id whose hash ignores its value: every block key then hashes alike."""

    def __hash__(self) -> int:
        return 7


def colliding(ids: list[int]) -> list[int]:
    return [CollidingToken(i) for i in ids]


def test_equal_hashes_never_share_blocks_between_different_contents():
    """Keys that hash alike are told apart by equality: a collision is a miss, never a hit."""
    a, b = colliding([1, 2, 3, 4]), colliding([5, 6, 7, 8])
    assert hash((kv_cache.ROOT_PREFIX_ID, tuple(a))) == hash((kv_cache.ROOT_PREFIX_ID, tuple(b)))
    bm = BlockManager(num_blocks=8, block_size=4)
    table_a, _ = computed(bm, a)
    table_b, _ = computed(bm, b)
    assert (table_a, table_b) == ([0], [1])
    assert bm.match_prefix(a, 4).block_ids == [0]
    assert bm.match_prefix(b, 4).block_ids == [1]
    assert bm.match_prefix(colliding([1, 2, 3, 5]), 4).block_ids == []
    # The same 4 tokens one block later have another parent: no match for them there.
    assert bm.match_prefix(a + a, 8).block_ids == [0]


def test_a_collision_in_a_parent_block_never_shares_the_child():
    """P and P' hash alike, and so do their children T: the block computed after P' holds K/V
    that depend on P', so it must never serve a query for P + T."""
    p, p_other, t = colliding([1, 2, 3, 4]), colliding([9, 2, 3, 4]), colliding([5, 6, 7, 8])
    bm = BlockManager(num_blocks=8, block_size=4)
    table_p, _ = computed(bm, p)
    table_x, _ = computed(bm, p_other + t)
    assert (table_p, table_x) == ([0], [1, 2])
    assert bm.match_prefix(p + t, 8).block_ids == [0]
    assert bm.match_prefix(p_other + t, 8).block_ids == [1, 2]


def test_eviction_order_and_recomputed_prefix_get_fresh_ids():
    """Children are evicted before their parents (tails are freed first), and a prefix computed
    again after eviction is cached under a new id: the old chain never matches again."""
    bm = BlockManager(num_blocks=3, block_size=4)
    p, t = [1, 2, 3, 4], [5, 6, 7, 8]
    table, ids = computed(bm, p + t)  # blocks 0 (P), 1 (T)
    bm.free(table)  # evictable, least recent first: 1 (T), 0 (P); block 2 is still free
    other, _ = computed(bm, [9, 9, 9, 9, 8, 8, 8, 8])  # takes free block 2, then evicts T
    assert other == [2, 1]
    assert bm.match_prefix(p + t, 8).block_ids == [0]
    bm.free(other)
    evictor, _ = computed(bm, [7, 7, 7, 7])  # LRU now 0 (P), 1, 2: evicts P
    assert evictor == [0]
    assert bm.match_prefix(p, 4).block_ids == []
    bm.free(evictor)
    again, again_ids = computed(bm, p)
    assert bm.match_prefix(p + t, 8).block_ids == again
    assert again_ids[0] != ids[0]


# --- prefix caching off ---------------------------------------------------------------------


def test_prefix_caching_disabled_never_matches_and_frees_straight_to_the_free_list():
    bm = BlockManager(num_blocks=4, block_size=4, enable_prefix_caching=False)
    tokens = [1, 2, 3, 4, 5, 6, 7, 8]
    table, hashes = computed(bm, tokens)
    assert table == [0, 1]
    assert hashes == []  # nothing registered
    for max_tokens in (0, 4, 7, 8, 100):
        match = bm.match_prefix(tokens, max_tokens)
        assert (match.block_ids, match.prefix_ids) == ([], [])
    bm.free(table)
    assert bm.num_free_blocks == 4
    assert bm.match_prefix(tokens, 8).block_ids == []
    # Free list: 2, 3 never used, then the freed tail first: 1, 0.
    again: list[int] = []
    bm.allocate(again, 16)
    assert again == [2, 3, 1, 0]


# --- random operations: ref counts, free counts, no leak, no stale match ---------------------


class Model:
    """The test's own record of live sequences and of what each block physically holds."""

    def __init__(self, bm: BlockManager):
        self.bm = bm
        self.seqs: list[tuple[list[int], list[int], list[int]]] = []  # (tokens, table, hashes)
        self.contents: dict[int, tuple[int, ...]] = {}  # block → the token prefix it ends

    def write(self, tokens: list[int], table: list[int], start: int, end: int) -> None:
        """Tokens [start, end) were computed into table's blocks."""
        bs = self.bm.block_size
        for i in range(start // bs, -(-end // bs)):
            self.contents[table[i]] = tuple(tokens[: min((i + 1) * bs, end)])

    def check_match(self, tokens: list[int], match: PrefixMatch) -> None:
        bs = self.bm.block_size
        for i, block in enumerate(match.block_ids):
            assert self.contents[block] == tuple(tokens[: (i + 1) * bs]), "stale or wrong hit"

    def check_invariants(self) -> None:
        bm = self.bm
        refs = ref_counts(bm)
        assert all(r >= 0 for r in refs)
        assert sum(len(table) for _, table, _ in self.seqs) == sum(refs)
        for block in range(bm.num_blocks):
            assert refs[block] == sum(table.count(block) for _, table, _ in self.seqs)
        for _, table, _ in self.seqs:
            assert len(set(table)) == len(table)
        in_use = {b for b in range(bm.num_blocks) if refs[b] > 0}
        assert bm.num_free_blocks + len(in_use) == bm.num_blocks
        assert bm.num_used_blocks == len(in_use)


def random_operations(seed: int, num_ops: int = 1000) -> None:
    rng = random.Random(seed)
    bm = BlockManager(num_blocks=12, block_size=4)
    model = Model(bm)
    seen: list[list[int]] = []  # token lists of past sequences, to reuse as prefixes
    for _ in range(num_ops):
        op = rng.random()
        if op < 0.4 or not model.seqs:  # add: match a prefix, allocate, compute
            head = list(rng.choice(seen)) if seen and rng.random() < 0.6 else []
            head = head[: rng.randint(0, len(head))]
            tokens = head + [rng.randint(0, 2) for _ in range(rng.randint(1, 12))]
            match = bm.match_prefix(tokens, len(tokens) - 1)
            model.check_match(tokens, match)
            num_cached = match.num_tokens(bm.block_size)
            table: list[int] = []
            if not bm.can_allocate(table, len(tokens), match):
                free_before = bm.num_free_blocks
                with pytest.raises(MemoryError):
                    bm.allocate(table, len(tokens), match)
                assert (table, bm.num_free_blocks) == ([], free_before)
            else:
                bm.allocate(table, len(tokens), match)
                assert table[: len(match.block_ids)] == match.block_ids
                hashes = list(match.prefix_ids)
                bm.cache_full_blocks(table, tokens, len(tokens), hashes)
                model.write(tokens, table, num_cached, len(tokens))
                model.seqs.append((tokens, table, hashes))
                seen.append(tokens)
        elif op < 0.75:  # grow a live sequence by a few tokens
            tokens, table, hashes = rng.choice(model.seqs)
            extra = [rng.randint(0, 2) for _ in range(rng.randint(1, 6))]
            num_tokens = len(tokens) + len(extra)
            if bm.can_allocate(table, num_tokens):
                old = len(tokens)
                bm.allocate(table, num_tokens)
                tokens.extend(extra)
                bm.cache_full_blocks(table, tokens, num_tokens, hashes)
                model.write(tokens, table, old, num_tokens)
            else:
                before = list(table)
                with pytest.raises(MemoryError):
                    bm.allocate(table, num_tokens)
                assert table == before
        else:  # free (finish or abort)
            index = rng.randrange(len(model.seqs))
            _, table, _ = model.seqs.pop(index)
            bm.free(table)
            assert table == []
        model.check_invariants()
    for _, table, _ in model.seqs:
        bm.free(table)
    model.seqs.clear()
    model.check_invariants()
    assert bm.num_free_blocks == bm.num_blocks  # no leak
    assert ref_counts(bm) == [0] * bm.num_blocks


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_operations_keep_ref_counts_consistent(seed):
    random_operations(seed)


@settings(max_examples=20, deadline=None)
@given(st.integers(min_value=0, max_value=2**32 - 1))
def test_random_operations_property(seed):
    random_operations(seed)


def test_free_tail_releases_the_blocks_past_what_the_tokens_need():
    # Speculative decoding allocated 3 blocks of 4 for 9 slots; 5 tokens stayed: 2 blocks.
    blocks = BlockManager(num_blocks=6, block_size=4)
    table: list[int] = []
    blocks.allocate(table, 9)
    kept = table[:2]
    blocks.free_tail(table, 5)
    assert table == kept and blocks.num_free_blocks == 4
    blocks.free_tail(table, 8)  # nothing past 2 blocks: unchanged
    assert table == kept and blocks.num_free_blocks == 4


def test_reset_prefix_cache_forgets_every_prefix_and_frees_its_blocks():
    bm = BlockManager(num_blocks=8, block_size=BS)
    table_a, _ = computed(bm, SEQ_A)  # 3 full blocks cached, one partial
    held, _ = computed(bm, SEQ_A[: 2 * BS], bm.match_prefix(SEQ_A, 2 * BS))
    assert not bm.reset_prefix_cache()  # blocks in use: refused, nothing changed
    assert bm.match_prefix(SEQ_A, 56).block_ids == [0, 1, 2]
    bm.free(held)
    bm.free(table_a)
    assert bm.reset_prefix_cache()
    assert (bm.num_used_blocks, bm.num_free_blocks) == (0, 8)
    assert bm.match_prefix(SEQ_A, 56).block_ids == []
    again, hashes = computed(bm, SEQ_A)  # cached afresh, under new prefix ids
    assert len(hashes) == 3 and bm.match_prefix(SEQ_A, 56).block_ids == again[:3]
