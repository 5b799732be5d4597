"""llmbench.kernels.prefill_attention: chunked-prefill attention (causal, varlen, paged, GQA)
against its reference, the reference against the engine's prefill path, the cost by hand, and
the layout errors."""

from __future__ import annotations

import math

import pytest
import torch

from llmbench.engine.paged_attention import Chunk, KVCache, build_attention_batch, paged_attention
from llmbench.kernels.cost import KernelCost
from llmbench.kernels.errors import KernelArgumentError
from llmbench.kernels.prefill_attention import (
    chunked_prefill_attention,
    chunked_prefill_attention_cost,
    chunked_prefill_attention_reference,
)
from tests.kernels.paged import random_paged_cache

TOLERANCE = {torch.float32: 2e-5, torch.float16: 3e-3, torch.bfloat16: 3e-2}

# (chunks (start, num_new), nh, nkv, d, block_size, K/V halves of one tensor)
CASES = {
    # a fresh prompt, a later chunk, a decode, a speculative check of 2 drafts
    "mixed-gqa2": ([(0, 20), (13, 5), (40, 1), (7, 3)], 4, 2, 16, 4, True),
    "one-prompt-three-row-blocks": ([(0, 33)], 2, 2, 32, 16, False),
    "gqa3-head-dim-8": ([(5, 17), (0, 2)], 6, 2, 8, 8, True),  # d padded to 16 for tl.dot
}


def query_index(chunks, device):
    starts = [0]
    for _, n in chunks:
        starts.append(starts[-1] + n)
    return torch.tensor(starts, dtype=torch.int32, device=device)


def run_case(case, dtype, device, seed=0):
    chunks, num_heads, num_kv_heads, head_dim, block_size, combined = CASES[case]
    lens = [s + n for s, n in chunks]
    cache = random_paged_cache(
        lens, num_kv_heads, head_dim, block_size, dtype, device, seed, combined
    )
    g = torch.Generator().manual_seed(seed + 1)
    num_tokens = sum(n for _, n in chunks)
    q = torch.randn(num_tokens, num_heads, head_dim, generator=g).to(dtype).to(device)
    args = (q, cache.key_cache, cache.value_cache, cache.block_tables, query_index(chunks, device))
    args += (cache.context_lens, block_size, 1 / math.sqrt(head_dim))
    out = chunked_prefill_attention(*args, max(n for _, n in chunks))
    return out, chunked_prefill_attention_reference(*args)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("case", list(CASES))
def test_kernel_matches_reference(case, dtype, device):
    out, expected = run_case(case, dtype, device)
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(out, expected, atol=tol, rtol=tol)


def test_reference_matches_the_engines_prefill_path():
    """A step with a fresh prompt, a second chunk of another prompt and a decode through
    `paged_attention` (which writes the step's K/V first); the reference reads the same cache."""
    num_heads, num_kv_heads, head_dim, block_size = 4, 2, 16, 4
    g = torch.Generator().manual_seed(3)
    cache = KVCache(1, 16, block_size, num_kv_heads, head_dim, torch.float32, "cpu")
    cache.kv.copy_(torch.randn(cache.kv.shape, generator=g))
    chunks = [Chunk(0, 9, [4, 12, 1]), Chunk(6, 5, [7, 2, 15]), Chunk(13, 1, [0, 3, 5, 9])]
    batch = build_attention_batch(chunks, block_size, torch.device("cpu"), torch.float32)
    q = torch.randn(15, num_heads, head_dim, generator=g)
    kv = torch.randn(15, 2, num_kv_heads, head_dim, generator=g)
    engine = paged_attention(q, kv, cache.layer(0), batch, 0.25)
    layer = cache.layer(0)
    block_tables = torch.tensor([c.block_table + [0] * (4 - len(c.block_table)) for c in chunks])
    expected = chunked_prefill_attention_reference(
        q,
        layer[:, 0],
        layer[:, 1],
        block_tables.int(),
        torch.tensor([0, 9, 14, 15]),
        torch.tensor([9, 11, 14]),
        block_size,
        0.25,
    )
    torch.testing.assert_close(engine, expected, atol=1e-5, rtol=1e-5)


def test_cost_by_hand():
    # Chunks (0, 3) and (4, 2): T = 5, contexts 3 and 6; nh 2, nkv 1, d 4, float16, block 4.
    # q read + out written 2·5·2·4·2 = 160 B; K and V (3 + 6)·2·1·4·2 = 144 B; block-table
    # entries 1 + 2 = 3 → 12 B; starts and lengths 4·(2·2 + 1) = 20 B → 336 B.
    # Keys seen: chunk (0, 3): 1 + 2 + 3 = 6; chunk (4, 2): 5 + 6 = 11 → 17;
    # FLOPs 4·nh·d·17 = 4·2·4·17 = 544.
    cost = chunked_prefill_attention_cost([(0, 3), (4, 2)], 2, 1, 4, "float16", 4)
    assert cost == KernelCost(bytes=336, flops=544)


def test_layout_errors_are_one_line(device):
    chunks = [(0, 5), (2, 3)]
    cache = random_paged_cache([5, 5], 2, 16, 4, torch.float32, device)
    q = torch.randn(8, 4, 16, device=device)
    starts = query_index(chunks, device)
    kc, vc, bt, lens = cache.key_cache, cache.value_cache, cache.block_tables, cache.context_lens
    op = "chunked_prefill_attention"
    with pytest.raises(KernelArgumentError, match=rf"{op}: query_start_loc must have shape \[N \+"):
        chunked_prefill_attention(q, kc, vc, bt, starts[:2], lens, 4, 0.25, 5)
    with pytest.raises(
        KernelArgumentError, match=f"{op}: context_lens has dtype int64; pass int32"
    ):
        chunked_prefill_attention(q, kc, vc, bt, starts, lens.long(), 4, 0.25, 5)
    with pytest.raises(KernelArgumentError, match=f"{op}: value_cache must be contiguous in its"):
        chunked_prefill_attention(q, kc, vc.transpose(1, 2), bt, starts, lens, 4, 0.25, 5)
    with pytest.raises(KernelArgumentError, match=rf"{op}: out must have shape q's \[T, nh, d\]"):
        chunked_prefill_attention(q, kc, vc, bt, starts, lens, 4, 0.25, 5, out=q[:4].clone())


@pytest.mark.gpu
def test_long_chunked_prompts_in_bfloat16_on_the_gpu():
    chunks = [(0, 1000), (3000, 512), (77, 1), (4096, 5)]
    lens = [s + n for s, n in chunks]
    device = torch.device("cuda")
    cache = random_paged_cache(lens, 8, 128, 16, torch.bfloat16, device)
    q = torch.randn(sum(n for _, n in chunks), 32, 128, device=device, dtype=torch.bfloat16)
    args = (q, cache.key_cache, cache.value_cache, cache.block_tables, query_index(chunks, device))
    args += (cache.context_lens, 16, 128**-0.5)
    out = chunked_prefill_attention(*args, 1000)
    torch.testing.assert_close(
        out, chunked_prefill_attention_reference(*args), atol=3e-2, rtol=3e-2
    )
