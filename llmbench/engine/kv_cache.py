"""Block manager: which KV-cache blocks are free, and which blocks each sequence owns.

Pure bookkeeping, no torch: a block is an integer index into the K/V pools of
`paged_attention.KVCache`. Each sequence has a block table (list of block ids, in position
order); `blocks_needed` and `allocate` grow it to cover a number of tokens.
"""

from __future__ import annotations

from collections import deque


def blocks_for(num_tokens: int, block_size: int) -> int:
    """Blocks needed to hold num_tokens: ceil(num_tokens / block_size)."""
    return -(-num_tokens // block_size)


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int):
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError(
                f"need num_blocks > 0 and block_size > 0, got {num_blocks}, {block_size}"
            )
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._free: deque[int] = deque(range(num_blocks))
        self._ref_counts = [0] * num_blocks

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self._free)

    def blocks_needed(self, block_table: list[int], num_tokens: int) -> int:
        """New blocks a sequence with this table needs to hold num_tokens tokens."""
        return max(0, blocks_for(num_tokens, self.block_size) - len(block_table))

    def can_allocate(self, block_table: list[int], num_tokens: int) -> bool:
        return self.blocks_needed(block_table, num_tokens) <= len(self._free)

    def allocate(self, block_table: list[int], num_tokens: int) -> None:
        """Append blocks to block_table (in place) until it covers num_tokens tokens."""
        needed = self.blocks_needed(block_table, num_tokens)
        if needed > len(self._free):
            raise MemoryError(f"KV cache: need {needed} blocks, {len(self._free)} free")
        for _ in range(needed):
            block = self._free.popleft()
            self._ref_counts[block] = 1
            block_table.append(block)

    def free(self, block_table: list[int]) -> None:
        """Release a sequence's blocks (in place: the table is emptied)."""
        for block in reversed(block_table):
            self._ref_counts[block] -= 1
            assert self._ref_counts[block] >= 0, f"block {block} freed twice"
            if self._ref_counts[block] == 0:
                self._free.append(block)
        block_table.clear()
