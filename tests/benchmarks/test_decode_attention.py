"""Tests for benchmarks/decode_attention.py: the batch it builds is the shape it says (every
block of a pool in one table, once; the bytes it counts by hand), the op it times is the
attention of the reference over each layer's own pool, and the read it compares with reads the
same bytes."""

from __future__ import annotations

import math

import pytest
import torch

from benchmarks import decode_attention
from llmbench.kernels.cpu_extension import default
from llmbench.kernels.decode_attention import paged_decode_attention_reference


@pytest.fixture(autouse=True)
def extension():
    """The op under test is the C++ extension's: built here, as CI builds it."""
    assert default().is_extension, default().reason


def test_the_batch_uses_every_block_once_and_counts_its_bytes():
    batch = decode_attention.make_batch(streams=3, context=40, num_pools=2)
    # 40 positions in blocks of 16: 3 blocks a stream, 9 in all, each in one table once
    assert batch.tables.shape == (3, 3)
    assert sorted(batch.tables.flatten().tolist()) == list(range(9))
    assert batch.pools[0].shape == (9 * 16, 2, 3, 64)
    # two distinct pools, repeated over the 30 layers
    assert len(batch.pools) == 30
    assert batch.pools[2] is batch.pools[0] and batch.pools[1] is not batch.pools[0]
    # 30 layers · 3 streams · 40 positions · K and V · 3 heads · 64 · 2 bytes
    assert batch.kv_bytes == 30 * 3 * 40 * 2 * 3 * 64 * 2


def test_a_pass_is_the_reference_attention_over_each_layer():
    batch = decode_attention.make_batch(streams=2, context=40, num_pools=2, seed=3)
    outputs = decode_attention.attention_pass(batch)()
    assert len(outputs) == 30
    for layer in (0, 1):
        pool = batch.pools[layer]
        expected = paged_decode_attention_reference(
            batch.q, pool[:, 0], pool[:, 1], batch.tables, batch.lens, 16, 1 / math.sqrt(64)
        )
        # bfloat16: both round the same float32 value once
        torch.testing.assert_close(outputs[layer].float(), expected.float(), rtol=2**-8, atol=2**-8)
    assert not torch.equal(outputs[0], outputs[1])  # each layer reads its own pool


def test_the_read_sums_the_same_pools():
    batch = decode_attention.make_batch(streams=1, context=16, num_pools=1, seed=4)
    pool_sum = float(batch.pools[0].view(torch.float32).sum())
    assert decode_attention.read_pass(batch)() == pytest.approx(30 * pool_sum, rel=1e-5)
    assert decode_attention.median_seconds(decode_attention.read_pass(batch), repeats=1) > 0
