"""llmbench.engine.paged_attention: attention through block tables, with K/V caches in the
model's dtype, in another float dtype, or quantised (int8, int4; keys and values apart), against
plain attention computed here token by token."""

from __future__ import annotations

import math

import pytest
import torch

from llmbench.engine.kv_dtype import KVCacheDtype, bytes_per_token
from llmbench.engine.kv_quant import dequantize, quantize
from llmbench.engine.paged_attention import (
    Chunk,
    KVCache,
    SplitLayer,
    build_attention_batch,
    paged_attention,
)
from llmbench.kernels import cpu_extension
from llmbench.roofline.cost_model import kv_bytes_per_elem

NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, BLOCK_SIZE = 4, 2, 16, 4
SCALE = 1 / math.sqrt(HEAD_DIM)
# Two sequences with scrambled block tables; A has an 11-token prompt, B a 6-token one, and each
# decodes one more token.
TABLES = {"A": [5, 2, 7], "B": [1, 6]}
LENGTHS = {"A": 12, "B": 7}
# (sequence, start, num_tokens) per step: two prefills (B chunked), a mixed step, two decodes.
STEPS = [
    [("A", 0, 11), ("B", 0, 4)],
    [("B", 4, 2), ("A", 11, 1)],
    [("A", 11, 1), ("B", 6, 1)],
]


def reference_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, start: int):
    """q [L, nh, d] at positions start.. over keys/values [C, nkv, d], causal, GQA by
    repeating each KV head for its group of query heads, softmax written out."""
    group = NUM_HEADS // NUM_KV_HEADS
    keys = keys.repeat_interleave(group, dim=1)  # [C, nh, d]
    values = values.repeat_interleave(group, dim=1)
    out = torch.empty_like(q)
    for i in range(q.shape[0]):
        visible = start + i + 1
        scores = torch.einsum("hd,chd->hc", q[i], keys[:visible]) * SCALE
        out[i] = torch.einsum("hc,chd->hd", scores.softmax(-1), values[:visible])
    return out


def round_trip(x: torch.Tensor, fmt: str) -> torch.Tensor:
    """What a cache in `fmt` gives back for x [..., d] (float32 model)."""
    if fmt == "float32":
        return x
    if fmt in ("bfloat16", "float16"):
        return x.to(getattr(torch, fmt)).float()
    return dequantize(*quantize(x, fmt), fmt, torch.float32)


def run_steps(kv_dtype: KVCacheDtype, seed: int = 0):
    """Run STEPS through a one-layer cache; per step the output and the exact reference of
    plain attention over (a) the float K/V, (b) the K/V as the cache stores them."""
    g = torch.Generator().manual_seed(seed)
    q = {s: torch.randn(n, NUM_HEADS, HEAD_DIM, generator=g) for s, n in LENGTHS.items()}
    kv = {s: torch.randn(n, 2, NUM_KV_HEADS, HEAD_DIM, generator=g) for s, n in LENGTHS.items()}
    for s in kv:
        kv[s][:, 0, :, 3] *= 4  # an outlier key channel: what makes keys hard to quantise
    cache = KVCache(1, 8, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM, torch.float32, "cpu", kv_dtype)
    stored = {
        s: torch.stack(
            [round_trip(kv[s][:, 0], cache.kv_dtype.k), round_trip(kv[s][:, 1], cache.kv_dtype.v)],
            dim=1,
        )
        for s in kv
    }
    results = []
    for step in STEPS:
        chunks = [Chunk(start, n, TABLES[s]) for s, start, n in step]
        batch = build_attention_batch(chunks, BLOCK_SIZE, torch.device("cpu"), torch.float32)
        rows = [(s, slice(start, start + n)) for s, start, n in step]
        out = paged_attention(
            torch.cat([q[s][r] for s, r in rows]),
            torch.cat([kv[s][r] for s, r in rows]),
            cache.layer(0),
            batch,
            SCALE,
        )
        for which in (kv, stored):
            expected = torch.cat(
                [
                    reference_attention(q[s][r], which[s][:, 0], which[s][:, 1], r.start)
                    for s, r in rows
                ]
            )
            results.append((out, expected))
    return results


@pytest.mark.parametrize(
    ("k", "v", "tolerance"),
    [
        ("auto", "auto", 1e-5),
        ("bfloat16", "bfloat16", 0.01),
        ("float16", "int8", 0.01),
        ("int8", "int8", 0.03),
        ("int8", "int4", 0.12),
        ("int4", "int8", 0.45),
        ("int4", "int4", 0.45),
    ],
)
def test_attention_over_a_quantised_cache_is_close_to_float_attention(k, v, tolerance):
    """Max |out - float attention| / max |float attention|, per scheme, over prefill, chunked
    prefill, mixed and decode steps (seed 0; measured: bfloat16 0.005, float16/int8 0.005,
    int8/int8 0.013, int8/int4 0.074, int4/int8 0.29, int4/int4 0.31): the outlier key channel
    takes int4's 15 levels of every key row, and a key's error moves the softmax itself."""
    results = run_steps(KVCacheDtype(k, v))
    for out, expected in results[0::2]:
        error = (out - expected).abs().max() / expected.abs().max()
        assert error < tolerance
        if k != "auto":
            assert error > 0  # the cache really rounds
    for out, expected in results[1::2]:
        # Against attention over exactly what the cache stores: only float rounding is left.
        torch.testing.assert_close(out, expected, atol=2e-5, rtol=2e-5)


def test_with_an_outlier_key_channel_int4_keys_cost_more_than_int4_values():
    for seed in range(4):
        errors = {}
        for k, v in (("int8", "int4"), ("int4", "int8")):
            results = run_steps(KVCacheDtype(k, v), seed)
            errors[k] = max(((o - e).abs().max() / e.abs().max()).item() for o, e in results[::2])
        assert errors["int4"] > 1.5 * errors["int8"], errors


def test_a_prompt_in_chunks_sees_the_same_quantised_keys_as_in_one_step():
    """A quantised cache is always read back: a prompt's last row comes out the same whether
    the prompt ran in one step or two (the fresh float K/V are never attended)."""
    g = torch.Generator().manual_seed(5)
    q = torch.randn(9, NUM_HEADS, HEAD_DIM, generator=g)
    kv = torch.randn(9, 2, NUM_KV_HEADS, HEAD_DIM, generator=g)
    kv_dtype = KVCacheDtype("int4", "int8")
    outputs = []
    for splits in ([(0, 9)], [(0, 5), (5, 4)]):
        cache = KVCache(1, 4, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM, torch.float32, "cpu", kv_dtype)
        for start, n in splits:
            batch = build_attention_batch(
                [Chunk(start, n, [3, 0, 2])], BLOCK_SIZE, torch.device("cpu"), torch.float32
            )
            rows = slice(start, start + n)
            out = paged_attention(q[rows], kv[rows], cache.layer(0), batch, SCALE)
        outputs.append(out[-1])
    torch.testing.assert_close(outputs[0], outputs[1], atol=1e-6, rtol=1e-6)


# (k, v) → bytes per token of a 2-layer, 2-KV-head, head_dim-16 float32 model, by hand:
# per layer and head, float32 16·4 = 64, bfloat16 32, int8 16 + 2 (scale) = 18, int4 8 + 2 = 10.
BYTES_PER_TOKEN = {
    ("auto", "auto"): 2 * 2 * (64 + 64),
    ("bfloat16", "bfloat16"): 2 * 2 * (32 + 32),
    ("bfloat16", "int8"): 2 * 2 * (32 + 18),
    ("int8", "int8"): 2 * 2 * (18 + 18),
    ("int8", "int4"): 2 * 2 * (18 + 10),
    ("int4", "int8"): 2 * 2 * (10 + 18),
    ("int4", "int4"): 2 * 2 * (10 + 10),
}


@pytest.mark.parametrize(("k", "v"), list(BYTES_PER_TOKEN))
def test_cache_tensors_take_exactly_the_bytes_per_token_the_formats_say(k, v):
    kv_dtype = KVCacheDtype(k, v)
    cache = KVCache(2, 5, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM, torch.float32, "cpu", kv_dtype)
    assert cache.num_tokens == 20
    assert cache.bytes_per_token == BYTES_PER_TOKEN[(k, v)]
    assert cache.num_bytes == 20 * BYTES_PER_TOKEN[(k, v)]
    assert bytes_per_token(2, NUM_KV_HEADS, HEAD_DIM, kv_dtype, 4) == BYTES_PER_TOKEN[(k, v)]
    # The cost model's napkin maths agrees with the tensors (the mean of K and V, scales in).
    resolved = cache.kv_dtype
    assert cache.bytes_per_elem == kv_bytes_per_elem(resolved.k, resolved.v, HEAD_DIM)
    is_split = isinstance(cache.layer(0), SplitLayer)
    assert is_split == (k != v or k in ("int8", "int4"))


@pytest.mark.parametrize("through", ["torch", "extension"])
def test_short_chunks_after_a_cached_context_are_attended_row_by_row_exactly(through):
    """Speculative verification's shape: sequences running 3 and 5 query rows (their last token
    and drafts) after cached contexts of 6 and 9 tokens, beside a decode and a fresh prefill,
    in one step; the short chunks' rows join the decode rows, each with its own context, and
    every row matches plain attention (through torch's SDPA, or the C++ extension's op)."""
    g = torch.Generator().manual_seed(7)
    tables = {"A": [5, 2, 7, 0], "B": [1, 6, 3], "C": [4], "D": [8, 9]}
    cached = {"A": 9, "B": 6, "C": 3, "D": 0}
    new = {"A": 5, "B": 3, "C": 1, "D": 7}
    lengths = {s: cached[s] + new[s] for s in tables}
    q = {s: torch.randn(n, NUM_HEADS, HEAD_DIM, generator=g) for s, n in lengths.items()}
    kv = {s: torch.randn(n, 2, NUM_KV_HEADS, HEAD_DIM, generator=g) for s, n in lengths.items()}
    cache = KVCache(1, 12, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM, torch.float32, "cpu")
    for s in tables:  # the cached contexts, written by an earlier step
        if cached[s]:
            batch = build_attention_batch(
                [Chunk(0, cached[s], tables[s])], BLOCK_SIZE, torch.device("cpu"), torch.float32
            )
            paged_attention(q[s][: cached[s]], kv[s][: cached[s]], cache.layer(0), batch, SCALE)
    order = ["A", "C", "B", "D"]
    chunks = [Chunk(cached[s], new[s], tables[s]) for s in order]
    batch = build_attention_batch(chunks, BLOCK_SIZE, torch.device("cpu"), torch.float32)
    assert [p.query_len for p in batch.prefills] == [7]  # D: a fresh prompt, causal
    # A's 5 rows, C's 1, B's 3 (the flat batch's rows 0-8), each seeing its own position on.
    assert batch.decodes.rows.tolist() == list(range(9)) and not batch.decodes.is_whole_batch
    assert batch.decodes.context_lens.tolist() == [10, 11, 12, 13, 14, 4, 7, 8, 9]
    assert batch.decodes.block_tables[1].tolist() == tables["A"]
    decode_op = None
    if through == "extension":
        backend = cpu_extension.default()
        assert backend.is_extension, backend.reason
        decode_op = backend.op("paged_decode_attention")
    out = paged_attention(
        torch.cat([q[s][cached[s] :] for s in order]),
        torch.cat([kv[s][cached[s] :] for s in order]),
        cache.layer(0),
        batch,
        SCALE,
        decode_op,
    )
    expected = torch.cat(
        [reference_attention(q[s][cached[s] :], kv[s][:, 0], kv[s][:, 1], cached[s]) for s in order]
    )
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


def test_a_step_of_decodes_only_has_the_general_paths_tensors():
    """A step whose every chunk is attended row by row (here plain decodes) takes
    `build_attention_batch`'s short path: its tensors are the ones worked out by hand from the
    block tables, and the gathered slots and padding bias (for attention through torch) come
    from the block tables when asked for."""
    tables = [[5, 2, 7], [1, 6], [4]]
    positions = [9, 4, 0]  # contexts of 10, 5 and 1 tokens
    chunks = [Chunk(p, 1, t) for p, t in zip(positions, tables, strict=True)]
    batch = build_attention_batch(chunks, BLOCK_SIZE, torch.device("cpu"), torch.bfloat16)
    # slot = table[p // 4] * 4 + p % 4
    assert batch.slot_mapping.tolist() == [7 * 4 + 1, 6 * 4 + 0, 4 * 4 + 0]
    assert batch.slot_mapping.dtype == torch.long and batch.prefills == []
    assert batch.max_position == 9
    d = batch.decodes
    assert d.is_whole_batch and d.rows.tolist() == [0, 1, 2]
    assert d.block_tables.dtype == torch.int32 and d.context_lens.dtype == torch.int32
    assert d.block_tables.tolist() == [[5, 2, 7], [1, 6, 0], [4, 0, 0]]
    assert d.context_lens.tolist() == [10, 5, 1] and d.max_context_len == 10
    assert d.slots.tolist() == [
        [20, 21, 22, 23, 8, 9, 10, 11, 28, 29],
        [4, 5, 6, 7, 24, 25, 26, 27, 0, 1],  # past its context (5): padding, masked below
        [16, 17, 18, 19, 0, 1, 2, 3, 0, 1],
    ]
    bias = d.bias
    assert bias.dtype == torch.bfloat16 and bias.shape == (3, 1, 1, 10)
    assert (bias[:, 0, 0] == float("-inf")).sum(dim=1).tolist() == [0, 5, 9]
    assert (bias[:, 0, 0, :1] == 0).all()
    # One more token after a step of decodes: the same tensors on the general path.
    mixed = build_attention_batch(
        [*chunks, Chunk(0, 2, [3])], BLOCK_SIZE, torch.device("cpu"), torch.bfloat16
    )
    assert torch.equal(mixed.slot_mapping[:3], batch.slot_mapping)
    assert mixed.decodes.lens == d.lens and torch.equal(mixed.decodes.slots, d.slots)
    assert torch.equal(mixed.decodes.block_tables, d.block_tables)


def test_a_step_of_decodes_and_verifications_has_a_row_per_token():
    """Speculative verification's chunk (its last token and 2 drafts after 9 cached tokens)
    beside a decode: one row per token, each with its own slot and context, its chunk's table."""
    chunks = [Chunk(9, 3, [5, 2, 7]), Chunk(4, 1, [1, 6])]
    batch = build_attention_batch(chunks, BLOCK_SIZE, torch.device("cpu"), torch.float32)
    d = batch.decodes
    assert batch.prefills == [] and d.is_whole_batch and d.rows.tolist() == [0, 1, 2, 3]
    # positions 9, 10, 11 (block 7: slots 29, 30, 31) and 4 (block 6: slot 24)
    assert batch.slot_mapping.tolist() == [29, 30, 31, 24]
    assert d.context_lens.tolist() == [10, 11, 12, 5] and batch.max_position == 11
    assert d.block_tables.tolist() == [[5, 2, 7]] * 3 + [[1, 6, 0]]
    assert (d.bias[:, 0, 0] == float("-inf")).sum(dim=1).tolist() == [2, 1, 0, 7]
