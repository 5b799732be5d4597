"""llmbench.kernels.decode_attention: paged decode attention (GQA, split-K) against its
reference over several shapes, block sizes and context lengths, the reference against the
engine's decode path, the cost by hand, and the layout errors."""

from __future__ import annotations

import math

import pytest
import torch

from llmbench.engine.paged_attention import Chunk, KVCache, build_attention_batch, paged_attention
from llmbench.kernels.cost import KernelCost
from llmbench.kernels.decode_attention import (
    num_partitions_for,
    paged_decode_attention,
    paged_decode_attention_cost,
    paged_decode_attention_reference,
)
from llmbench.kernels.errors import KernelArgumentError
from tests.kernels.paged import random_paged_cache

TOLERANCE = {torch.float32: 2e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}

# (context lengths, nh, nkv, d, block_size, partition_size, K/V halves of one tensor)
CASES = {
    "gqa2-one-partition": ([5, 37, 70], 4, 2, 16, 4, 512, True),
    "gqa2-split-k": ([5, 37, 70], 4, 2, 16, 4, 32, True),  # 3 partitions, some empty
    "mqa-long-default-split": ([1, 600], 6, 1, 32, 16, 512, False),  # 600 > 512: split-K
    "mha-block-8": ([9, 16], 3, 3, 16, 8, 512, True),
}


def run_case(case, dtype, device, seed=0):
    lens, num_heads, num_kv_heads, head_dim, block_size, partition, combined = CASES[case]
    cache = random_paged_cache(
        lens, num_kv_heads, head_dim, block_size, dtype, device, seed, combined
    )
    g = torch.Generator().manual_seed(seed + 1)
    q = torch.randn(len(lens), num_heads, head_dim, generator=g).to(dtype).to(device)
    args = (q, cache.key_cache, cache.value_cache, cache.block_tables, cache.context_lens)
    scale = 1 / math.sqrt(head_dim)
    out = paged_decode_attention(*args, block_size, scale, max(lens), partition_size=partition)
    return out, paged_decode_attention_reference(*args, block_size, scale)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("case", list(CASES))
def test_kernel_matches_reference(case, dtype, device):
    out, expected = run_case(case, dtype, device)
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(out, expected, atol=tol, rtol=tol)


def test_split_k_is_taken_where_the_cases_say():
    assert num_partitions_for(70, 512) == 1
    assert num_partitions_for(70, 32) == 3
    assert num_partitions_for(600) == 2


def test_reference_matches_the_engines_decode_path():
    """Three sequences decode one token each through `paged_attention` (one cache layer, the
    new K/V written first); the reference reads the same cache through block tables."""
    num_heads, num_kv_heads, head_dim, block_size = 4, 2, 16, 4
    g = torch.Generator().manual_seed(7)
    cache = KVCache(1, 12, block_size, num_kv_heads, head_dim, torch.float32, "cpu")
    cache.kv.copy_(torch.randn(cache.kv.shape, generator=g))
    tables, lens = [[5, 2, 7], [1], [11, 0, 3, 9]], [10, 3, 16]
    chunks = [Chunk(n - 1, 1, t) for t, n in zip(tables, lens, strict=True)]
    batch = build_attention_batch(chunks, block_size, torch.device("cpu"), torch.float32)
    q = torch.randn(3, num_heads, head_dim, generator=g)
    kv = torch.randn(3, 2, num_kv_heads, head_dim, generator=g)
    engine = paged_attention(q, kv, cache.layer(0), batch, 0.25)  # writes kv, then attends
    layer = cache.layer(0)
    block_tables = torch.tensor([t + [0] * (4 - len(t)) for t in tables], dtype=torch.int32)
    expected = paged_decode_attention_reference(
        q, layer[:, 0], layer[:, 1], block_tables, torch.tensor(lens), block_size, 0.25
    )
    torch.testing.assert_close(engine, expected, atol=1e-5, rtol=1e-5)


def test_cost_by_hand():
    # B = 2 at contexts 3 and 5, nh 4, nkv 2, d 8, float16, block 4, one partition:
    # q read + out written 2·2·4·8·2 = 256 B; K and V (3 + 5)·2·2·8·2 = 512 B; block-table
    # entries ceil(3/4) + ceil(5/4) = 3 → 12 B; lengths 2·4 = 8 B → 788 B.
    # FLOPs 4·nh·d·Σ C = 4·4·8·8 = 1024.
    assert paged_decode_attention_cost([3, 5], 4, 2, 8, "float16", 4) == KernelCost(788, 1024)
    # Contexts 20 and 5, partitions of 16: P = 2. q/out 256; K/V 25·64 = 1600; entries
    # 5 + 2 = 7 → 28; lengths 8; partials written and read 2·4·2·4·2·(8 + 2) = 1280 → 3172 B.
    # FLOPs 4·4·8·25 = 3200 + the reduce 3·2·4·2·8 = 384 → 3584.
    assert paged_decode_attention_cost([20, 5], 4, 2, 8, "float16", 4, 16) == KernelCost(3172, 3584)


def test_layout_errors_are_one_line(device):
    cache = random_paged_cache([6, 9], 2, 16, 4, torch.float32, device)
    q = torch.randn(2, 4, 16, device=device)
    kc, vc, bt, lens = cache.key_cache, cache.value_cache, cache.block_tables, cache.context_lens
    op = "paged_decode_attention"
    with pytest.raises(KernelArgumentError, match=f"{op}: q must be contiguous in its last 2"):
        paged_decode_attention(q.transpose(1, 2), kc, vc, bt, lens, 4, 0.25, 9)
    with pytest.raises(KernelArgumentError, match=f"{op}: block_tables has dtype int64; pass int"):
        paged_decode_attention(q, kc, vc, bt.long(), lens, 4, 0.25, 9)
    with pytest.raises(KernelArgumentError, match=f"{op}: key_cache has dtype float16, q float32"):
        paged_decode_attention(q, kc.half(), vc, bt, lens, 4, 0.25, 9)
    with pytest.raises(
        KernelArgumentError, match=r"key_cache must be \[S, nkv, d\] with d = 16 an"
    ):
        paged_decode_attention(torch.randn(2, 3, 16, device=device), kc, vc, bt, lens, 4, 0.25, 9)
    with pytest.raises(
        KernelArgumentError,
        match=f"{op}: max_context_len 99 must be in 1..max_blocks·block_size = 16",
    ):
        paged_decode_attention(q, kc, vc, bt, lens, 4, 0.25, 99)
    with pytest.raises(KernelArgumentError, match="partition_size must be a positive multiple of"):
        paged_decode_attention(q, kc, vc, bt, lens, 4, 0.25, 9, partition_size=24)


@pytest.mark.gpu
def test_llama_shapes_in_bfloat16_with_split_k_on_the_gpu():
    lens = [1, 17, 511, 512, 513, 5000]
    cache = random_paged_cache(lens, 8, 128, 16, torch.bfloat16, torch.device("cuda"))
    q = torch.randn(len(lens), 32, 128, device="cuda", dtype=torch.bfloat16)
    args = (q, cache.key_cache, cache.value_cache, cache.block_tables, cache.context_lens, 16)
    out = paged_decode_attention(*args, 128**-0.5, max(lens))
    expected = paged_decode_attention_reference(*args, 128**-0.5)
    torch.testing.assert_close(out, expected, atol=2e-2, rtol=2e-2)
