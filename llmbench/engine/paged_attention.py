"""Paged KV storage and attention through block tables (the torch path, used on CPU).

The cache is one pool of `num_blocks * block_size` slots per layer. A token's K/V live in slot
`block_table[pos // block_size] * block_size + pos % block_size`; a sequence's blocks need not be
contiguous, which is what lets the block manager share prefix blocks and free memory in pieces.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


class KVCache:
    """K and V pools: [num_layers, num_blocks * block_size, nkv, d] each."""

    def __init__(
        self,
        num_layers: int,
        num_blocks: int,
        block_size: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
    ):
        self.num_blocks = num_blocks
        self.block_size = block_size
        shape = (num_layers, num_blocks * block_size, num_kv_heads, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)

    def layer(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.k[i], self.v[i]

    @property
    def num_bytes(self) -> int:
        return 2 * self.k.numel() * self.k.element_size()


@dataclass(frozen=True)
class SeqSlice:
    """One sequence's part of a flat batch.

    Its `query_len` new tokens sit at rows [query_start, query_start + query_len) and are the
    last tokens of a context of `context_len` tokens, whose K/V slots are `kv_slots` [context_len].
    """

    query_start: int
    query_len: int
    context_len: int
    kv_slots: torch.Tensor


@dataclass(frozen=True)
class AttentionBatch:
    slot_mapping: torch.Tensor  # [T]: the cache slot each new token's K/V is written to
    seqs: list[SeqSlice]
    max_position: int


def slots_for(block_table: list[int], start: int, end: int, block_size: int) -> list[int]:
    """Cache slots of positions [start, end) of a sequence with this block table."""
    return [block_table[p // block_size] * block_size + p % block_size for p in range(start, end)]


def paged_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cache: tuple[torch.Tensor, torch.Tensor],
    batch: AttentionBatch,
    scale: float,
) -> torch.Tensor:
    """q: [T, nh, d]; k, v: [T, nkv, d] (this step's tokens) → attention output [T, nh, d].

    Writes k/v into the cache first, then each sequence attends causally over its whole context.
    """
    k_cache, v_cache = cache  # [slots, nkv, d]
    k_cache.index_copy_(0, batch.slot_mapping, k)
    v_cache.index_copy_(0, batch.slot_mapping, v)
    out = torch.empty_like(q)
    for s in batch.seqs:
        rows = slice(s.query_start, s.query_start + s.query_len)
        if s.context_len == s.query_len:
            # Whole context is in this step: attend to the fresh K/V, no gather from the pool.
            ks, vs = k[rows], v[rows]
        else:
            ks, vs = k_cache[s.kv_slots], v_cache[s.kv_slots]  # [C, nkv, d]
        mask = None
        is_causal = s.query_len > 1 and s.context_len == s.query_len
        if s.query_len > 1 and not is_causal:
            # Query i sits at position C - L + i and may see keys 0 ..= that position.
            offset = s.context_len - s.query_len
            key_pos = torch.arange(s.context_len, device=q.device)
            query_pos = torch.arange(s.query_len, device=q.device) + offset
            mask = key_pos[None, :] <= query_pos[:, None]  # [L, C]
        o = F.scaled_dot_product_attention(
            q[rows].transpose(0, 1),
            ks.transpose(0, 1),
            vs.transpose(0, 1),
            attn_mask=mask,
            is_causal=is_causal,
            scale=scale,
            enable_gqa=True,
        )  # [nh, L, d]
        out[rows] = o.transpose(0, 1)
    return out
