"""Random paged K/V caches for the attention tests: scrambled block tables, never-zero values."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class PagedCache:
    key_cache: torch.Tensor  # [S, nkv, d]
    value_cache: torch.Tensor  # [S, nkv, d]
    block_tables: torch.Tensor  # [N, max_blocks] int32, padded with block 0
    context_lens: torch.Tensor  # [N] int32


def random_paged_cache(
    context_lens: list[int],
    num_kv_heads: int,
    head_dim: int,
    block_size: int,
    dtype: torch.dtype,
    device: torch.device,
    seed: int = 0,
    is_combined: bool = True,
) -> PagedCache:
    """A cache with each sequence's blocks scattered over the pool (plus spare blocks that no
    table names). `is_combined`: K and V are the halves of one [S, 2, nkv, d] tensor (the
    engine's layout, slot stride 2·nkv·d), else two contiguous tensors."""
    g = torch.Generator().manual_seed(seed)
    num_blocks = [-(-c // block_size) for c in context_lens]
    pool = sum(num_blocks) + 3
    order = torch.randperm(pool, generator=g).tolist()
    width = max(num_blocks) + 1  # one padding column more than any sequence needs
    tables = torch.zeros(len(context_lens), width, dtype=torch.int32)
    taken = 0
    for i, n in enumerate(num_blocks):
        tables[i, :n] = torch.tensor(order[taken : taken + n], dtype=torch.int32)
        taken += n
    slots = pool * block_size
    kv = torch.randn(slots, 2, num_kv_heads, head_dim, generator=g).to(dtype).to(device)
    if is_combined:
        key_cache, value_cache = kv[:, 0], kv[:, 1]
    else:
        key_cache, value_cache = kv[:, 0].contiguous(), kv[:, 1].contiguous()
    return PagedCache(
        key_cache,
        value_cache,
        tables.to(device),
        torch.tensor(context_lens, dtype=torch.int32, device=device),
    )
