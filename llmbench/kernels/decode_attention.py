"""Paged decode attention: one new query token per sequence over its K/V in the paged cache.

Shapes: B sequences, nh query heads, nkv KV heads (GQA: g = nh / nkv query heads share one),
d head dim, S cache slots. Sequence b's position p lives in slot
`block_tables[b, p // block_size] · block_size + p % block_size`; it attends positions
0 .. context_lens[b] − 1 (its new token's K/V already written). No causal mask is needed for
one query at the end of its context.

Split-K for long contexts: the context is cut into partitions of `partition_size` positions, one
program per (sequence, KV head, partition) keeps a running max m, sum l and unnormalised output
acc (online softmax) for the g query heads of its KV head, and a reduce kernel combines them:

    M = max_p m_p,   out = Σ_p e^(m_p − M)·acc_p / Σ_p e^(m_p − M)·l_p

With one partition the first kernel normalises and writes the output itself.
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
from llmbench.kernels.triton_support import check_launchable, next_power_of_2, tl, triton_kernel

OP = "paged_decode_attention"
PARTITION_SIZE = 512  # positions per split-K partition
BLOCK_N = 16  # positions per inner-loop tile


@triton_kernel
def _decode_partition_kernel(
    q_ptr,
    q_token_stride,
    key_cache_ptr,
    key_slot_stride,
    value_cache_ptr,
    value_slot_stride,
    block_tables_ptr,
    block_table_stride,
    context_lens_ptr,
    out_ptr,
    partial_out_ptr,
    partial_max_ptr,
    partial_sum_ptr,
    scale,
    num_partitions,
    num_heads,
    block_size,
    HEAD_DIM: tl.constexpr,
    GROUP: tl.constexpr,
    BLOCK_G: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PARTITION_SIZE: tl.constexpr,
    IS_PARTITIONED: tl.constexpr,
):
    seq = tl.program_id(0).to(tl.int64)
    kv_head = tl.program_id(1)
    part = tl.program_id(2)
    context_len = tl.load(context_lens_ptr + seq)
    start = part * PARTITION_SIZE
    end = tl.minimum(start + PARTITION_SIZE, context_len)

    g = tl.arange(0, BLOCK_G)
    dims = tl.arange(0, BLOCK_D)
    heads = kv_head * GROUP + g  # the query heads that share this KV head
    g_mask = g < GROUP
    d_mask = dims < HEAD_DIM
    q_ptrs = q_ptr + seq * q_token_stride + heads[:, None] * HEAD_DIM + dims[None, :]
    q = tl.load(q_ptrs, mask=g_mask[:, None] & d_mask[None, :], other=0.0).to(tl.float32)
    q = q * scale  # [G, D]

    m = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l_sum = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
    for n0 in range(start, end, BLOCK_N):
        pos = n0 + tl.arange(0, BLOCK_N)
        p_mask = pos < end
        block = tl.load(
            block_tables_ptr + seq * block_table_stride + pos // block_size, mask=p_mask, other=0
        )
        slot = block.to(tl.int64) * block_size + pos % block_size  # [N]
        kv_mask = p_mask[:, None] & d_mask[None, :]
        offsets = kv_head * HEAD_DIM + dims[None, :]
        k_ptrs = key_cache_ptr + slot[:, None] * key_slot_stride + offsets
        k = tl.load(k_ptrs, mask=kv_mask, other=0.0)  # masked rows: 0, never garbage
        s = tl.sum(q[:, None, :] * k.to(tl.float32)[None, :, :], axis=2)  # [G, N]
        s = tl.where(p_mask[None, :], s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))
        alpha = tl.exp(m - m_new)
        p = tl.exp(s - m_new[:, None])
        l_sum = l_sum * alpha + tl.sum(p, axis=1)
        v_ptrs = value_cache_ptr + slot[:, None] * value_slot_stride + offsets
        v = tl.load(v_ptrs, mask=kv_mask, other=0.0)  # p = 0 there, and 0 · NaN would be NaN
        acc = acc * alpha[:, None] + tl.sum(p[:, :, None] * v.to(tl.float32)[None, :, :], axis=1)
        m = m_new

    out_mask = g_mask[:, None] & d_mask[None, :]
    if IS_PARTITIONED:
        row = (seq * num_heads + heads) * num_partitions + part  # [G] into [B, nh, P]
        tl.store(partial_max_ptr + row, m, mask=g_mask)
        tl.store(partial_sum_ptr + row, l_sum, mask=g_mask)
        tl.store(partial_out_ptr + row[:, None] * HEAD_DIM + dims[None, :], acc, mask=out_mask)
    else:
        o = acc / l_sum[:, None]
        o_ptrs = out_ptr + (seq * num_heads + heads[:, None]) * HEAD_DIM + dims[None, :]
        tl.store(o_ptrs, o.to(out_ptr.dtype.element_ty), mask=out_mask)


@triton_kernel
def _decode_reduce_kernel(
    partial_out_ptr,
    partial_max_ptr,
    partial_sum_ptr,
    out_ptr,
    num_partitions,
    HEAD_DIM: tl.constexpr,
    BLOCK_P: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    # One program per (sequence, query head): combine its partitions. A partition past the
    # context holds m = -inf, l = 0, acc = 0 and weighs 0; partition 0 is never empty.
    row = tl.program_id(0).to(tl.int64)  # seq · nh + head
    parts = tl.arange(0, BLOCK_P)
    dims = tl.arange(0, BLOCK_D)
    p_mask = parts < num_partitions
    base = row * num_partitions + parts
    m = tl.load(partial_max_ptr + base, mask=p_mask, other=float("-inf"))
    l_sum = tl.load(partial_sum_ptr + base, mask=p_mask, other=0.0)
    weight = tl.exp(m - tl.max(m, axis=0))  # [P]
    acc_mask = p_mask[:, None] & (dims < HEAD_DIM)[None, :]
    acc = tl.load(
        partial_out_ptr + base[:, None] * HEAD_DIM + dims[None, :], mask=acc_mask, other=0.0
    )
    o = tl.sum(weight[:, None] * acc, axis=0) / tl.sum(weight * l_sum, axis=0)
    tl.store(out_ptr + row * HEAD_DIM + dims, o.to(out_ptr.dtype.element_ty), mask=dims < HEAD_DIM)


def decode_slots(
    block_tables: torch.Tensor, context_lens: torch.Tensor, block_size: int
) -> torch.Tensor:
    """Slots [B, max C] of positions 0..C-1 of each sequence (slot 0 past its context)."""
    max_len = int(context_lens.max())
    pos = torch.arange(max_len, device=block_tables.device)
    blocks = block_tables.long()[:, pos // block_size]  # [B, C]
    slots = blocks * block_size + pos % block_size
    return torch.where(pos[None, :] < context_lens[:, None].long(), slots, 0)


def paged_decode_attention_reference(
    q: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    block_size: int,
    scale: float,
) -> torch.Tensor:
    """q [B, nh, d] over key_cache, value_cache [S, nkv, d] → [B, nh, d], in float32 and
    rounded once to q's dtype; one sequence at a time, no padding."""
    num_heads, num_kv_heads = q.shape[1], key_cache.shape[1]
    group = num_heads // num_kv_heads
    slots = decode_slots(block_tables, context_lens, block_size)
    out = torch.empty_like(q)
    for b in range(q.shape[0]):
        seq_slots = slots[b, : int(context_lens[b])]
        k = key_cache[seq_slots].float().repeat_interleave(group, dim=1)  # [C, nh, d]
        v = value_cache[seq_slots].float().repeat_interleave(group, dim=1)
        scores = torch.einsum("hd,chd->hc", q[b].float(), k) * scale  # [nh, C]
        out[b] = torch.einsum("hc,chd->hd", scores.softmax(-1), v).to(q.dtype)
    return out


def num_partitions_for(max_context_len: int, partition_size: int = PARTITION_SIZE) -> int:
    """Split-K partitions a context of max_context_len positions is cut into (>= 1)."""
    return max(1, -(-max_context_len // partition_size))


def paged_decode_attention(
    q: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    block_size: int,
    scale: float,
    max_context_len: int,
    partition_size: int = PARTITION_SIZE,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """The Triton kernels: q [B, nh, d] over the paged cache → out [B, nh, d].

    key_cache, value_cache: [S, nkv, d] in q's dtype (inner [nkv, d] contiguous; the slot
    stride is free, so they may be the K and V halves of one [S, 2, nkv, d] tensor);
    block_tables: [B, max_blocks] int32; context_lens: [B] int32, each in 1..max_context_len
    (a host int, so the launch needs no device sync). Split-K when max_context_len exceeds
    partition_size (a multiple of BLOCK_N).
    """
    check_tensor(OP, "q", q, "[B, nh, d]", FLOAT_DTYPES, 2)
    batch, num_heads, head_dim = q.shape
    device = q.device
    check_paged_cache(OP, q, key_cache, value_cache)
    check_tensor(OP, "block_tables", block_tables, "[B, max_blocks]", (torch.int32,), 2, device)
    check_value(
        OP,
        block_tables.shape[0] == batch,
        f"block_tables must have B = {batch} rows, got {tuple(block_tables.shape)}",
    )
    check_tensor(OP, "context_lens", context_lens, "[B]", (torch.int32,), device=device)
    check_shape(OP, "context_lens", context_lens, (batch,), "[B]")
    check_value(OP, block_size > 0, f"block_size must be > 0, got {block_size}")
    check_value(
        OP,
        0 < max_context_len <= block_tables.shape[1] * block_size,
        f"max_context_len {max_context_len} must be in 1..max_blocks·block_size = "
        f"{block_tables.shape[1] * block_size}",
    )
    check_value(
        OP,
        partition_size > 0 and partition_size % BLOCK_N == 0,
        f"partition_size must be a positive multiple of {BLOCK_N}, got {partition_size}",
    )
    if out is None:
        out = torch.empty_like(q)
    check_tensor(OP, "out", out, "[B, nh, d]", (q.dtype,), 3, device)
    check_shape(OP, "out", out, tuple(q.shape), "q's [B, nh, d]")
    check_launchable(OP, device.type)
    if batch == 0:
        return out
    num_kv_heads = key_cache.shape[1]
    group = num_heads // num_kv_heads
    num_partitions = num_partitions_for(max_context_len, partition_size)
    is_partitioned = num_partitions > 1
    if is_partitioned:
        partial_out = torch.empty(
            (batch, num_heads, num_partitions, head_dim), dtype=torch.float32, device=device
        )
        partial_max = torch.empty(
            (batch, num_heads, num_partitions), dtype=torch.float32, device=device
        )
        partial_sum = torch.empty_like(partial_max)
    else:
        partial_out = partial_max = partial_sum = out  # unused
    block_d = next_power_of_2(head_dim)
    _decode_partition_kernel[(batch, num_kv_heads, num_partitions)](
        q,
        q.stride(0),
        key_cache,
        key_cache.stride(0),
        value_cache,
        value_cache.stride(0),
        block_tables,
        block_tables.stride(0),
        context_lens,
        out,
        partial_out,
        partial_max,
        partial_sum,
        float(scale),
        num_partitions,
        num_heads,
        block_size,
        HEAD_DIM=head_dim,
        GROUP=group,
        BLOCK_G=next_power_of_2(group),
        BLOCK_D=block_d,
        BLOCK_N=BLOCK_N,
        PARTITION_SIZE=partition_size,
        IS_PARTITIONED=is_partitioned,
    )
    if is_partitioned:
        _decode_reduce_kernel[(batch * num_heads,)](
            partial_out,
            partial_max,
            partial_sum,
            out,
            num_partitions,
            HEAD_DIM=head_dim,
            BLOCK_P=next_power_of_2(num_partitions),
            BLOCK_D=block_d,
        )
    return out


def paged_decode_attention_cost(
    context_lens: Sequence[int],
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    dtype: object,
    block_size: int,
    partition_size: int = PARTITION_SIZE,
) -> KernelCost:
    """Bytes and FLOPs of one launch (both kernels when split) over B sequences.

    Formula (C_b = context_lens[b], P = partitions of max C_b):
      bytes = 2·B·nh·d·b (read q, write out) + Σ_b C_b·2·nkv·d·b (K and V, each read once per
              KV head) + 4·Σ_b ceil(C_b / block_size) (block-table entries) + 4·B (lengths)
              + with P > 1: 2 (write, read back) · 4·B·nh·P·(d + 2) (float32 partial
              outputs, maxima and sums);
      flops = 4·nh·d·Σ_b C_b (q·k and p·v, one multiply-add each per key, head and dim)
              + with P > 1: 3·B·nh·P·d (the reduce: weight × partial, sum, and the divide).
    Softmax exponentials and rescales (O(nh·C)) are left out, as the engine's cost model does.
    """
    b = dtype_bytes(dtype)
    batch, total = len(context_lens), sum(context_lens)
    num_bytes = 2 * batch * num_heads * head_dim * b + total * 2 * num_kv_heads * head_dim * b
    num_bytes += 4 * sum(-(-c // block_size) for c in context_lens) + 4 * batch
    flops = 4 * num_heads * head_dim * total
    num_partitions = num_partitions_for(max(context_lens, default=1), partition_size)
    if num_partitions > 1:
        num_bytes += 2 * 4 * batch * num_heads * num_partitions * (head_dim + 2)
        flops += 3 * batch * num_heads * num_partitions * head_dim
    return KernelCost(int(num_bytes), int(flops))
