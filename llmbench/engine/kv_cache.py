"""Block manager: which KV-cache blocks are free, which each sequence owns, which hold a prefix.

Pure bookkeeping, no torch: a block is an integer index into the pool of
`paged_attention.KVCache`. A sequence's block table lists its blocks in position order.

Prefix caching: a *full* block is found by the chained key (parent's prefix id, the block's token
ids), and registering it gives it a fresh prefix id. So two sequences that share their first k full
blocks of tokens share those k blocks. The key is looked up in a dict, which hashes it but
accepts a hit only on an *equal* key, and a prefix id names one exact token prefix and is never
reused (an evicted block's id dies with it). Different contents therefore never share a block,
whatever their hashes: no collision is possible by construction. Blocks no sequence uses keep
their contents and stay findable until they are evicted, least recently freed first, when a new
block is needed.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict, deque
from collections.abc import Sequence
from dataclasses import dataclass

ROOT_PREFIX_ID = 0  # the empty prefix, parent of every sequence's first block


def blocks_for(num_tokens: int, block_size: int) -> int:
    """Blocks needed to hold num_tokens: ceil(num_tokens / block_size)."""
    return -(-num_tokens // block_size)


def blocks_in_budget(budget_bytes: float, bytes_per_token: int, block_size: int) -> int:
    """Whole blocks a KV cache of budget_bytes holds, at the cache's real bytes per token (K
    and V of every layer, scales included): a cache half the bytes per token holds twice the
    tokens.

    Formula: floor(budget_bytes / (bytes_per_token · block_size)).
    """
    return int(budget_bytes // (bytes_per_token * block_size))


@dataclass(frozen=True)
class PrefixMatch:
    """Leading full blocks of a token sequence that are already in the cache."""

    block_ids: list[int]
    prefix_ids: list[int]  # the prefix id that ends at each of those blocks

    def num_tokens(self, block_size: int) -> int:
        return len(self.block_ids) * block_size


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True):
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError(f"need num_blocks, block_size > 0, got {num_blocks}, {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self._free: deque[int] = deque(range(num_blocks))  # no contents worth keeping
        self._evictable: OrderedDict[int, None] = OrderedDict()  # cached, unused; LRU first
        self._ref_counts = [0] * num_blocks
        self._cached: dict[tuple[int, tuple[int, ...]], int] = {}  # (parent id, tokens) → block
        self._block_keys: dict[int, tuple[int, tuple[int, ...]]] = {}  # cached block → its key
        self._prefix_ids: dict[int, int] = {}  # cached block → its prefix id
        self._next_prefix_id = itertools.count(ROOT_PREFIX_ID + 1)

    # -- counts ---------------------------------------------------------------------------

    @property
    def num_free_blocks(self) -> int:
        """Blocks an allocation may take: truly free ones plus cached ones nobody uses."""
        return len(self._free) + len(self._evictable)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - self.num_free_blocks

    def ref_count(self, block: int) -> int:
        return self._ref_counts[block]

    # -- prefix cache ---------------------------------------------------------------------

    def match_prefix(self, token_ids: Sequence[int], max_tokens: int) -> PrefixMatch:
        """The cached leading full blocks of token_ids, covering at most max_tokens tokens.

        Looks only; nothing is acquired until `allocate(..., prefix=...)`.
        """
        match = PrefixMatch([], [])
        if not self.enable_prefix_caching:
            return match
        parent = ROOT_PREFIX_ID
        bs = self.block_size
        for start in range(0, max_tokens - bs + 1, bs):
            block = self._cached.get((parent, tuple(token_ids[start : start + bs])))
            if block is None:
                break
            parent = self._prefix_ids[block]
            match.block_ids.append(block)
            match.prefix_ids.append(parent)
        return match

    def cache_full_blocks(
        self,
        block_table: list[int],
        token_ids: Sequence[int],
        num_computed_tokens: int,
        prefix_ids: list[int],
    ) -> None:
        """Register the blocks that computed tokens have filled since the last call.

        prefix_ids is the sequence's chain so far (extended in place). A block whose content is
        already cached elsewhere is not registered; the chain continues through the cached one.
        """
        if not self.enable_prefix_caching:
            return
        bs = self.block_size
        for i in range(len(prefix_ids), num_computed_tokens // bs):
            parent = prefix_ids[-1] if prefix_ids else ROOT_PREFIX_ID
            key = (parent, tuple(token_ids[i * bs : (i + 1) * bs]))
            block = self._cached.get(key)
            if block is None:
                block = block_table[i]
                self._cached[key] = block
                self._block_keys[block] = key
                self._prefix_ids[block] = next(self._next_prefix_id)
            prefix_ids.append(self._prefix_ids[block])

    def reset_prefix_cache(self) -> bool:
        """Forget every cached prefix, as a fresh cache would start: the blocks nobody uses are
        freed and no key matches again. Only when no sequence holds a block (False otherwise:
        a block in use keeps its contents, and its key could not be dropped without a sequence
        later caching under a parent that no longer exists)."""
        if any(self._ref_counts):
            return False
        self._free.extend(self._evictable)
        self._evictable.clear()
        self._cached.clear()
        self._block_keys.clear()
        self._prefix_ids.clear()
        return True

    # -- allocation -----------------------------------------------------------------------

    def blocks_needed(self, block_table: list[int], num_tokens: int) -> int:
        """New blocks a sequence with this table needs to hold num_tokens tokens."""
        return max(0, blocks_for(num_tokens, self.block_size) - len(block_table))

    def can_allocate(
        self, block_table: list[int], num_tokens: int, prefix: PrefixMatch | None = None
    ) -> bool:
        """Whether allocate() would succeed; cached prefix blocks that sit unused in the LRU
        stop being free once acquired, so they count against the free blocks too."""
        table_len = len(block_table) + (len(prefix.block_ids) if prefix else 0)
        needed = max(0, blocks_for(num_tokens, self.block_size) - table_len)
        if prefix:
            needed += sum(1 for b in prefix.block_ids if self._ref_counts[b] == 0)
        return needed <= self.num_free_blocks

    def allocate(
        self, block_table: list[int], num_tokens: int, prefix: PrefixMatch | None = None
    ) -> None:
        """Grow block_table (in place) to cover num_tokens, first with the prefix's blocks."""
        if not self.can_allocate(block_table, num_tokens, prefix):
            raise MemoryError(f"KV cache: not enough free blocks for {num_tokens} tokens")
        if prefix:
            for block in prefix.block_ids:
                if self._ref_counts[block] == 0:
                    del self._evictable[block]
                self._ref_counts[block] += 1
                block_table.append(block)
        for _ in range(self.blocks_needed(block_table, num_tokens)):
            block = self._take_block()
            self._ref_counts[block] = 1
            block_table.append(block)

    def _take_block(self) -> int:
        if self._free:
            return self._free.popleft()
        block, _ = self._evictable.popitem(last=False)  # least recently freed
        del self._cached[self._block_keys.pop(block)]
        del self._prefix_ids[block]  # gone for good: children keyed on it can never match
        return block

    def free(self, block_table: list[int]) -> None:
        """Release a sequence's blocks (in place: the table is emptied). The tail is released
        first, so the LRU evicts a prefix's last blocks before its shared first ones."""
        for block in reversed(block_table):
            if self._ref_counts[block] <= 0:
                raise AssertionError(f"block {block} freed more often than allocated")
            self._ref_counts[block] -= 1
            if self._ref_counts[block] == 0:
                if block in self._block_keys:
                    self._evictable[block] = None
                else:
                    self._free.append(block)
        block_table.clear()

    def free_tail(self, block_table: list[int], num_tokens: int) -> None:
        """Release the blocks past the ones num_tokens need (in place): what a rejected
        speculation wrote there holds no verified token, so none of them is in the prefix cache."""
        keep = blocks_for(num_tokens, self.block_size)
        tail = block_table[keep:]
        del block_table[keep:]
        self.free(tail)
