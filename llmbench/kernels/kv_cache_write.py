"""Paged KV-cache write: token t's K and V go to slot slots[t] of the cache pool.

The cache of one layer is a pool of S = num_blocks · block_size slots, each holding a token's
[nkv, d] keys in `key_cache` [S, nkv, d] and values in `value_cache` [S, nkv, d]. The two may
be views of one tensor [S, 2, nkv, d] (K and V of a slot side by side, the engine's layout):
only the inner [nkv, d] must be contiguous, the slot stride is free. A slot < 0 means "do not
store" (a padded row). Kernel, reference, cost and checks.
"""

from __future__ import annotations

import torch

from llmbench.kernels.checks import (
    FLOAT_DTYPES,
    INDEX_DTYPES,
    check_same_dtype,
    check_shape,
    check_tensor,
)
from llmbench.kernels.cost import KernelCost, dtype_bytes
from llmbench.kernels.triton_support import check_launchable, next_power_of_2, tl, triton_kernel

OP = "kv_cache_write"


@triton_kernel
def _kv_cache_write_kernel(
    key_ptr,
    key_token_stride,
    value_ptr,
    value_token_stride,
    key_cache_ptr,
    key_cache_slot_stride,
    value_cache_ptr,
    value_cache_slot_stride,
    slots_ptr,
    row_size,
    BLOCK: tl.constexpr,
):
    # One program per token and BLOCK elements of its [nkv·d] row.
    token = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    slot = tl.load(slots_ptr + token).to(tl.int64)
    mask = cols < tl.where(slot >= 0, row_size, 0)  # a padded row (slot < 0) stores nothing
    k = tl.load(key_ptr + token * key_token_stride + cols, mask=mask)
    v = tl.load(value_ptr + token * value_token_stride + cols, mask=mask)
    k = k.to(key_cache_ptr.dtype.element_ty)
    v = v.to(value_cache_ptr.dtype.element_ty)
    tl.store(key_cache_ptr + slot * key_cache_slot_stride + cols, k, mask=mask)
    tl.store(value_cache_ptr + slot * value_cache_slot_stride + cols, v, mask=mask)


def kv_cache_write_reference(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slots: torch.Tensor,
) -> None:
    """key, value [T, nkv, d] → key_cache, value_cache [S, nkv, d] at rows slots [T] (< 0:
    skipped)."""
    keep = slots >= 0
    key_cache.index_copy_(0, slots[keep], key[keep].to(key_cache.dtype))
    value_cache.index_copy_(0, slots[keep], value[keep].to(value_cache.dtype))


def kv_cache_write(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slots: torch.Tensor,
) -> None:
    """The Triton kernel: store key, value [T, nkv, d] into key_cache, value_cache [S, nkv, d]
    (cast to the cache's float dtype) at slots [T] (int32/int64; < 0 skips the token). Slots
    must be distinct and < S."""
    check_tensor(OP, "key", key, "[T, nkv, d]", FLOAT_DTYPES, 2)
    num_tokens, num_kv_heads, head_dim = key.shape
    device = key.device
    check_tensor(OP, "value", value, "[T, nkv, d]", FLOAT_DTYPES, 2, device)
    check_shape(OP, "value", value, tuple(key.shape), "key's [T, nkv, d]")
    check_same_dtype(OP, "value", value, "key", key.dtype)
    for name, cache in (("key_cache", key_cache), ("value_cache", value_cache)):
        check_tensor(OP, name, cache, "[S, nkv, d]", FLOAT_DTYPES, 2, device)
        check_shape(OP, name, cache, (cache.shape[0], num_kv_heads, head_dim), "[S, nkv, d]")
    check_same_dtype(OP, "value_cache", value_cache, "key_cache", key_cache.dtype)
    check_tensor(OP, "slots", slots, "[T]", INDEX_DTYPES, device=device)
    check_shape(OP, "slots", slots, (num_tokens,), "[T]")
    check_launchable(OP, device.type)
    if num_tokens == 0:
        return
    row_size = num_kv_heads * head_dim
    block = min(1024, next_power_of_2(row_size))
    grid = (num_tokens, -(-row_size // block))
    _kv_cache_write_kernel[grid](
        key,
        key.stride(0),
        value,
        value.stride(0),
        key_cache,
        key_cache.stride(0),
        value_cache,
        value_cache.stride(0),
        slots,
        row_size,
        BLOCK=block,
    )


def kv_cache_write_cost(
    num_tokens: int,
    num_kv_heads: int,
    head_dim: int,
    dtype: object,
    cache_dtype: object | None = None,
    index_dtype: object = "int64",
) -> KernelCost:
    """Bytes and FLOPs of one launch writing T tokens' K and V.

    Formula: bytes = 2 (K and V) · T·nkv·d·(b + b_cache) (read in dtype, write in the cache's)
                     + T·b_index (slots);
             flops = 0 (a cast is not arithmetic).
    """
    b_cache = dtype_bytes(cache_dtype if cache_dtype is not None else dtype)
    elements = num_tokens * num_kv_heads * head_dim
    num_bytes = 2 * elements * (dtype_bytes(dtype) + b_cache)
    return KernelCost(int(num_bytes + num_tokens * dtype_bytes(index_dtype)), 0)
