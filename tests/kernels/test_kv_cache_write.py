"""llmbench.kernels.kv_cache_write: the Triton kernel against its reference and against the
engine's cache write, the cost by hand, and the layout errors."""

from __future__ import annotations

import pytest
import torch

from llmbench.engine.paged_attention import KVCache
from llmbench.kernels.cost import KernelCost
from llmbench.kernels.errors import KernelArgumentError
from llmbench.kernels.kv_cache_write import (
    kv_cache_write,
    kv_cache_write_cost,
    kv_cache_write_reference,
)

NUM_KV_HEADS, HEAD_DIM, NUM_SLOTS = 2, 16, 40


def fused_kv(num_tokens, dtype, device, seed=0):
    """k, v [T, nkv, d] as views of one fused qkv row (token stride = the qkv width)."""
    g = torch.Generator().manual_seed(seed)
    qkv = torch.randn(num_tokens, 4 * 16 + 2 * NUM_KV_HEADS * HEAD_DIM, generator=g)
    kv = qkv.to(dtype).to(device)[:, 64:].view(num_tokens, 2, NUM_KV_HEADS, HEAD_DIM)
    return kv


def caches(dtype, device, is_combined):
    filled = torch.randn(NUM_SLOTS, 2, NUM_KV_HEADS, HEAD_DIM).to(dtype).to(device)
    if is_combined:
        return filled[:, 0], filled[:, 1]
    return filled[:, 0].contiguous(), filled[:, 1].contiguous()


@pytest.mark.parametrize(
    ("dtype", "cache_dtype"),
    [
        (torch.float32, torch.float32),
        (torch.float16, torch.float16),
        (torch.float32, torch.float16),
    ],
)
@pytest.mark.parametrize("is_combined", [True, False])
def test_kernel_matches_reference(dtype, cache_dtype, is_combined, device):
    kv = fused_kv(5, dtype, device)
    slots = torch.tensor([17, 3, -1, 39, 0], device=device)  # -1: a padded row, not stored
    key_cache, value_cache = caches(cache_dtype, device, is_combined)
    expected_k, expected_v = key_cache.clone(), value_cache.clone()
    kv_cache_write_reference(kv[:, 0], kv[:, 1], expected_k, expected_v, slots)
    kv_cache_write(kv[:, 0], kv[:, 1], key_cache, value_cache, slots)
    assert torch.equal(key_cache, expected_k)
    assert torch.equal(value_cache, expected_v)
    assert torch.equal(key_cache[39], kv[3, 0].to(cache_dtype))


def test_kernel_matches_the_engines_write_into_its_cache_layer(device):
    kv = fused_kv(6, torch.float32, device, seed=3)
    slots = torch.tensor([9, 2, 30, 31, 4, 5], device=device)
    engine = KVCache(1, 10, 4, NUM_KV_HEADS, HEAD_DIM, torch.float32, device)
    ours = KVCache(1, 10, 4, NUM_KV_HEADS, HEAD_DIM, torch.float32, device)
    engine.layer(0).index_copy_(0, slots, kv)  # what paged_attention does in the model's dtype
    layer = ours.layer(0)  # [S, 2, nkv, d]
    kv_cache_write(kv[:, 0], kv[:, 1], layer[:, 0], layer[:, 1], slots.int())
    assert torch.equal(ours.kv, engine.kv)


def test_cost_by_hand():
    # T = 3, nkv = 2, d = 4, float16: K and V read 2·3·8·2 = 96 B and written 96 B; int64
    # slots 3·8 = 24 B → 216 B; no FLOPs.
    assert kv_cache_write_cost(3, 2, 4, "float16") == KernelCost(bytes=216, flops=0)
    # float32 in, float16 cache: read 2·24·4 = 192, write 2·24·2 = 96, int32 slots 12 → 300.
    assert kv_cache_write_cost(3, 2, 4, "float32", "float16", "int32").bytes == 300


def test_layout_errors_are_one_line(device):
    kv = fused_kv(3, torch.float32, device)
    key_cache, value_cache = caches(torch.float32, device, True)
    slots = torch.tensor([0, 1, 2], device=device)
    with pytest.raises(KernelArgumentError, match="kv_cache_write: key must be contiguous in its"):
        kv_cache_write(kv[:, 0].transpose(1, 2), kv[:, 1], key_cache, value_cache, slots)
    with pytest.raises(KernelArgumentError, match="kv_cache_write: slots has dtype float32; pass"):
        kv_cache_write(kv[:, 0], kv[:, 1], key_cache, value_cache, slots.float())
    with pytest.raises(KernelArgumentError, match=r"kv_cache_write: value_cache must have shape"):
        kv_cache_write(kv[:, 0], kv[:, 1], key_cache, value_cache[:, :1], slots)
    with pytest.raises(
        KernelArgumentError, match="value_cache has dtype float16, key_cache float32"
    ):
        kv_cache_write(kv[:, 0], kv[:, 1], key_cache, value_cache.half(), slots)
    with pytest.raises(KernelArgumentError, match=r"kv_cache_write: slots must have shape \[T\]"):
        kv_cache_write(kv[:, 0], kv[:, 1], key_cache, value_cache, slots[:2])
