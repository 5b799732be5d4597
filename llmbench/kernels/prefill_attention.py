"""Chunked-prefill attention: several sequences' query chunks, causal, over their paged cache.

The flat batch q [T, nh, d] holds N sequences' query rows back to back: sequence n owns rows
query_start_loc[n] .. query_start_loc[n+1] − 1, the last L_n = (that count) positions of a
context of C_n = context_lens[n] tokens whose K/V (this chunk's included) are already in the
paged cache. Its query i sits at position C_n − L_n + i and attends positions 0 ..= that one. A
fresh prompt is L = C; a later chunk or a prefix-cache hit is L < C; a decode is L = 1; a
speculative check of k drafts is L = k + 1: one kernel serves them all.

One program per (sequence, query head, BLOCK_M query rows) streams the keys in tiles of
BLOCK_N positions (slots looked up through the block table per position, so any block_size
works) with an online softmax; GQA maps query head h to KV head h // (nh / nkv).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from llmbench.kernels.checks import (
    FLOAT_DTYPES,
    check_paged_cache,
    check_shape,
    check_tensor,
    check_value,
)
from llmbench.kernels.cost import KernelCost, dtype_bytes
from llmbench.kernels.decode_attention import decode_slots
from llmbench.kernels.triton_support import check_launchable, next_power_of_2, tl, triton_kernel

OP = "chunked_prefill_attention"
BLOCK_M = 16  # query rows per program
BLOCK_N = 16  # key positions per inner-loop tile


@triton_kernel
def _prefill_kernel(
    q_ptr,
    q_token_stride,
    key_cache_ptr,
    key_slot_stride,
    value_cache_ptr,
    value_slot_stride,
    block_tables_ptr,
    block_table_stride,
    query_start_loc_ptr,
    context_lens_ptr,
    out_ptr,
    scale,
    num_heads,
    block_size,
    HEAD_DIM: tl.constexpr,
    GROUP: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    seq = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    m_block = tl.program_id(2)
    kv_head = head // GROUP
    q_start = tl.load(query_start_loc_ptr + seq)
    query_len = tl.load(query_start_loc_ptr + seq + 1) - q_start
    context_len = tl.load(context_lens_ptr + seq)

    rows = m_block * BLOCK_M + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, BLOCK_D)
    row_mask = rows < query_len
    d_mask = dims < HEAD_DIM
    query_pos = context_len - query_len + rows  # [M]
    token = (q_start + rows).to(tl.int64)
    q_ptrs = q_ptr + token[:, None] * q_token_stride + head * HEAD_DIM + dims[None, :]
    q = tl.load(q_ptrs, mask=row_mask[:, None] & d_mask[None, :], other=0.0)  # [M, D]

    # Keys up to the last row's position (none when this block has no rows).
    has_rows = m_block * BLOCK_M < query_len
    key_end = tl.minimum(context_len, context_len - query_len + (m_block + 1) * BLOCK_M)
    key_end = tl.where(has_rows, key_end, 0)

    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_sum = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    for n0 in range(0, key_end, BLOCK_N):
        pos = n0 + tl.arange(0, BLOCK_N)
        p_mask = pos < key_end
        block = tl.load(
            block_tables_ptr + seq * block_table_stride + pos // block_size, mask=p_mask, other=0
        )
        slot = block.to(tl.int64) * block_size + pos % block_size
        kv_mask = p_mask[:, None] & d_mask[None, :]
        offsets = kv_head * HEAD_DIM + dims[None, :]
        k = tl.load(
            key_cache_ptr + slot[:, None] * key_slot_stride + offsets, mask=kv_mask, other=0.0
        )
        s = tl.dot(q, tl.trans(k), input_precision="ieee") * scale  # [M, N]
        is_visible = p_mask[None, :] & (pos[None, :] <= query_pos[:, None])
        s = tl.where(is_visible, s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))
        alpha = tl.exp(m - m_new)
        p = tl.exp(s - m_new[:, None])
        l_sum = l_sum * alpha + tl.sum(p, axis=1)
        v = tl.load(
            value_cache_ptr + slot[:, None] * value_slot_stride + offsets, mask=kv_mask, other=0.0
        )
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision="ieee")
        m = m_new

    o = acc / tl.where(l_sum > 0, l_sum, 1.0)[:, None]  # l_sum = 0 only in rows past the chunk
    o_ptrs = out_ptr + (token[:, None] * num_heads + head) * HEAD_DIM + dims[None, :]
    tl.store(o_ptrs, o.to(out_ptr.dtype.element_ty), mask=row_mask[:, None] & d_mask[None, :])


def chunked_prefill_attention_reference(
    q: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_start_loc: torch.Tensor,
    context_lens: torch.Tensor,
    block_size: int,
    scale: float,
) -> torch.Tensor:
    """q [T, nh, d] → [T, nh, d]: each sequence's rows over its context, causal, in float32
    and rounded once to q's dtype."""
    num_heads, num_kv_heads = q.shape[1], key_cache.shape[1]
    group = num_heads // num_kv_heads
    slots = decode_slots(block_tables, context_lens, block_size)
    out = torch.empty_like(q)
    starts = query_start_loc.tolist()
    for n, context_len in enumerate(context_lens.tolist()):
        rows = slice(starts[n], starts[n + 1])
        query_len = starts[n + 1] - starts[n]
        k = key_cache[slots[n, :context_len]].float().repeat_interleave(group, dim=1)
        v = value_cache[slots[n, :context_len]].float().repeat_interleave(group, dim=1)
        scores = torch.einsum("lhd,chd->hlc", q[rows].float(), k) * scale  # [nh, L, C]
        query_pos = torch.arange(query_len) + (context_len - query_len)
        is_visible = torch.arange(context_len)[None, :] <= query_pos[:, None]  # [L, C]
        scores = scores.masked_fill(~is_visible.to(q.device), float("-inf"))
        out[rows] = torch.einsum("hlc,chd->lhd", scores.softmax(-1), v).to(q.dtype)
    return out


def chunked_prefill_attention(
    q: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_start_loc: torch.Tensor,
    context_lens: torch.Tensor,
    block_size: int,
    scale: float,
    max_query_len: int,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """The Triton kernel: q [T, nh, d] over the paged cache → out [T, nh, d].

    key_cache, value_cache: [S, nkv, d] in q's dtype (inner [nkv, d] contiguous, slot stride
    free); block_tables: [N, max_blocks] int32; query_start_loc: [N + 1] int32 (0, then the
    running total of query lengths, ending at T); context_lens: [N] int32, each >= its query
    length; max_query_len: the longest query length (a host int: no device sync).
    """
    check_tensor(OP, "q", q, "[T, nh, d]", FLOAT_DTYPES, 2)
    num_tokens, num_heads, head_dim = q.shape
    device = q.device
    check_paged_cache(OP, q, key_cache, value_cache)
    check_tensor(OP, "block_tables", block_tables, "[N, max_blocks]", (torch.int32,), 2, device)
    num_seqs = block_tables.shape[0]
    check_tensor(OP, "query_start_loc", query_start_loc, "[N + 1]", (torch.int32,), device=device)
    check_shape(OP, "query_start_loc", query_start_loc, (num_seqs + 1,), "[N + 1]")
    check_tensor(OP, "context_lens", context_lens, "[N]", (torch.int32,), device=device)
    check_shape(OP, "context_lens", context_lens, (num_seqs,), "[N]")
    check_value(OP, block_size > 0, f"block_size must be > 0, got {block_size}")
    check_value(OP, max_query_len >= 0, f"max_query_len must be >= 0, got {max_query_len}")
    if out is None:
        out = torch.empty_like(q)
    check_tensor(OP, "out", out, "[T, nh, d]", (q.dtype,), 3, device)
    check_shape(OP, "out", out, tuple(q.shape), "q's [T, nh, d]")
    check_launchable(OP, device.type)
    if num_seqs == 0 or num_tokens == 0 or max_query_len == 0:
        return out
    group = num_heads // key_cache.shape[1]
    grid = (num_seqs, num_heads, -(-max_query_len // BLOCK_M))
    _prefill_kernel[grid](
        q,
        q.stride(0),
        key_cache,
        key_cache.stride(0),
        value_cache,
        value_cache.stride(0),
        block_tables,
        block_tables.stride(0),
        query_start_loc,
        context_lens,
        out,
        float(scale),
        num_heads,
        block_size,
        HEAD_DIM=head_dim,
        GROUP=group,
        BLOCK_M=BLOCK_M,
        BLOCK_N=BLOCK_N,
        BLOCK_D=max(16, next_power_of_2(head_dim)),  # tl.dot wants every dim >= 16
    )
    return out


def chunked_prefill_attention_cost(
    chunks: Sequence[tuple[int, int]],
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    dtype: object,
    block_size: int,
) -> KernelCost:
    """Bytes and FLOPs of one launch over chunks (start, num_new): num_new query rows at
    positions start .. start + num_new − 1, over a context of C = start + num_new.

    Formula (T = Σ num_new):
      bytes = 2·T·nh·d·b (read q, write out) + Σ C·2·nkv·d·b (each context's K and V once:
              the programs of one sequence re-read them from cache, not memory)
              + 4·Σ ceil(C / block_size) (block-table entries) + 4·(2N + 1) (lengths, starts);
      flops = 4·nh·d·Σ (n·s + n(n+1)/2) (q·k and p·v per visible key: query i of a chunk
              (s, n) sees s + i + 1 keys), as the engine's cost model counts attention.
    """
    b = dtype_bytes(dtype)
    num_tokens = sum(n for _, n in chunks)
    contexts = [s + n for s, n in chunks]
    num_bytes = 2 * num_tokens * num_heads * head_dim * b
    num_bytes += sum(contexts) * 2 * num_kv_heads * head_dim * b
    num_bytes += 4 * sum(-(-c // block_size) for c in contexts) + 4 * (2 * len(chunks) + 1)
    keys = sum(n * s + n * (n + 1) // 2 for s, n in chunks)
    return KernelCost(int(num_bytes), 4 * num_heads * head_dim * keys)
