"""The C++ extension's per-layer ops (`kernels.cpu_layer_ops`) against the torch references the
Triton kernels are checked against, on random inputs over several shapes, dtypes and context
lengths, and their argument checks."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
import torch

from llmbench.kernels import cpu_layer_ops
from llmbench.kernels.decode_attention import paged_decode_attention_reference
from llmbench.kernels.errors import KernelArgumentError
from llmbench.kernels.rms_norm import rms_norm_reference
from llmbench.kernels.rope import rope_reference_
from llmbench.kernels.silu_and_mul import silu_and_mul_reference

DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def _random(shape, dtype, seed):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows, hidden", [(1, 576), (5, 576), (3, 40), (33, 7)])
def test_rms_norm_matches_reference(backend, dtype, rows, hidden):
    x = _random((rows, hidden), dtype, 1) * 3
    weight = _random((hidden,), dtype, 2)
    y = cpu_layer_ops.rms_norm(backend, x, weight, 1e-5)
    expected = rms_norm_reference(x, weight, 1e-5)
    assert y.dtype == dtype and y.shape == x.shape
    if dtype == torch.float32:  # the sum of squares in another order: float32 rounding
        torch.testing.assert_close(y, expected, rtol=1e-6, atol=1e-6)
    else:  # normalised in float32 and rounded once: one rounding of the same value
        torch.testing.assert_close(y.float(), expected.float(), rtol=2**-8, atol=0)


def test_rms_norm_matches_torch_bfloat16(backend):
    x, weight = _random((4, 576), torch.bfloat16, 3), _random((576,), torch.bfloat16, 4)
    expected = torch.nn.functional.rms_norm(x, (576,), weight, 1e-5)
    assert (cpu_layer_ops.rms_norm(backend, x, weight, 1e-5) != expected).sum() <= 4


def _cos_sin(num_positions: int, head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    inv_freq = 1.0 / (10000 ** (torch.arange(0, head_dim, 2).float() / head_dim))
    angles = torch.outer(torch.arange(num_positions).float(), inv_freq)
    return angles.cos(), angles.sin()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("head_dim, heads", [(64, 12), (32, 3), (6, 5)])
def test_rope_rotates_strided_rows_in_place_like_the_reference(backend, dtype, head_dim, heads):
    # q and k columns of a fused qkv matrix: the rows are strided, the v columns untouched.
    width = heads * head_dim
    qkv = _random((4, width + 2 * head_dim), dtype, 5)
    positions = torch.tensor([0, 7, 31, 2])
    cos, sin = _cos_sin(32, head_dim)
    expected = qkv[:, :width].clone()
    rope_reference_(expected, positions, cos, sin, head_dim)
    out = qkv.clone()
    cos_sin = torch.stack((cos, sin), dim=-1)
    cpu_layer_ops.rope_(backend, out[:, :width], positions, cos_sin, head_dim)
    torch.testing.assert_close(out[:, :width], expected, rtol=0, atol=0)
    assert torch.equal(out[:, width:], qkv[:, width:])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows, inter", [(1, 1536), (3, 40), (2, 7)])  # 16-wide, and the tails
def test_silu_and_mul_matches_reference(backend, dtype, rows, inter):
    # Gates from -60 to 60: e^-g must not overflow where g is very negative.
    gate_up = _random((rows, 2 * inter), dtype, 14) * 20
    gate_up[0, 0], gate_up[0, 1] = -60, 60
    out = cpu_layer_ops.silu_and_mul(backend, gate_up)
    expected = silu_and_mul_reference(gate_up)
    assert out.dtype == dtype and out.shape == (rows, inter)
    # float32: e^x's range reduction loses ~|x|·6e-8 relative (3e-6 at x = -50), where silu
    # and its error are tiny: absolute on the outputs' scale. 16 bits: within a unit.
    rtol = {torch.float32: 1e-6, torch.bfloat16: 2**-8, torch.float16: 2**-10}[dtype]
    atol = rtol * expected.float().abs().max().item()
    torch.testing.assert_close(out.float(), expected.float(), rtol=rtol, atol=atol)
    if dtype == torch.float32:  # silu(-60) = -60·e^-60 / (1 + e^-60): tiny, never -inf or NaN
        up = gate_up[0, inter].item()
        expected_00 = -60 * math.exp(-60) / (1 + math.exp(-60)) * up
        assert out[0, 0].item() == pytest.approx(expected_00, rel=1e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_silu_and_mul_in_16_bits_is_off_by_at_most_one_unit(backend, dtype):
    # The 16-bit outputs take e^x and 1 / (1 + e) to ~1e-4 (the float32 ones exactly): each
    # output is the exact value rounded, or its neighbour where that value lies within ~1e-4
    # of a rounding boundary (a few in a hundred).
    gate = torch.linspace(-30, 30, 2 * 3072, dtype=torch.float64)
    up = torch.linspace(0.5, 3.0, 2 * 3072, dtype=torch.float64).flip(0)
    gate_up = torch.cat([gate.view(2, 3072), up.view(2, 3072)], dim=1).to(dtype)
    out = cpu_layer_ops.silu_and_mul(backend, gate_up).double()
    g, u = gate_up.double().chunk(2, dim=1)
    exact = g * torch.sigmoid(g) * u
    rounded = exact.to(dtype).double()
    # a unit at |rounded| (at most this), or float16's subnormal spacing
    bits, smallest = {torch.bfloat16: (7, 2.0**-133), torch.float16: (10, 2.0**-24)}[dtype]
    unit = (rounded.abs() * 2.0**-bits).clamp_min(smallest)
    off = (out - rounded).abs()
    assert (off <= unit).all()
    assert (off == 0).double().mean() >= 0.9


def test_silu_and_mul_of_a_strided_view_and_an_odd_width(backend):
    gate_up = _random((3, 20), torch.float32, 15)
    out = cpu_layer_ops.silu_and_mul(backend, gate_up[::2])  # rows 0 and 2: strided rows
    torch.testing.assert_close(out, silu_and_mul_reference(gate_up[::2]), rtol=1e-6, atol=1e-7)
    with pytest.raises(KernelArgumentError, match="width must be 2·I"):
        cpu_layer_ops.silu_and_mul(backend, gate_up[:, :7])


def _paged_case(dtype, context_lens, num_heads, num_kv_heads, head_dim, block_size, seed):
    """q, the K/V halves of one [S, 2, nkv, d] pool, block tables (shuffled blocks) and lens."""
    max_blocks = -(-max(context_lens) // block_size)
    num_blocks = max_blocks * len(context_lens) + 3
    pool = _random((num_blocks * block_size, 2, num_kv_heads, head_dim), dtype, seed)
    order = torch.randperm(num_blocks, generator=torch.Generator().manual_seed(seed))
    tables = order[: max_blocks * len(context_lens)].view(len(context_lens), max_blocks)
    q = _random((len(context_lens), num_heads, head_dim), dtype, seed + 1)
    lens = torch.tensor(context_lens, dtype=torch.int32)
    return q, pool[:, 0], pool[:, 1], tables.to(torch.int32).contiguous(), lens


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "context_lens, num_heads, num_kv_heads, head_dim, block_size",
    [
        ([1], 9, 3, 64, 16),  # the first decode step: one key
        ([256], 9, 3, 64, 16),  # one sequence, split in partitions across threads
        ([2000], 4, 1, 32, 32),  # long: many partitions; MQA
        ([1, 37, 300, 700], 9, 3, 64, 16),  # mixed lengths in one batch
        ([5, 17], 4, 4, 24, 8),  # no GQA; a head_dim with a scalar tail (24 = 16 + 8)
        # bfloat16 weighs the values of 4 query heads a pass (2 from head_dim 96): every
        # count of heads left for the last pass, 1 to 4
        ([300], 3, 3, 64, 16),  # 1 a pass
        ([300], 8, 4, 64, 16),  # 2
        ([300], 8, 1, 64, 16),  # 4 + 4
        ([300], 6, 1, 64, 16),  # 4 + 2
        ([300], 5, 1, 96, 16),  # 2 + 2 + 1
        ([300], 6, 1, 128, 16),  # 2 + 2 + 2
    ],
)
def test_decode_attention_matches_reference(
    backend, dtype, context_lens, num_heads, num_kv_heads, head_dim, block_size
):
    q, keys, values, tables, lens = _paged_case(
        dtype, context_lens, num_heads, num_kv_heads, head_dim, block_size, 7
    )
    scale = head_dim**-0.5
    out = cpu_layer_ops.paged_decode_attention(
        backend, q, keys, values, tables, lens, block_size, scale, max(context_lens)
    )
    expected = paged_decode_attention_reference(q, keys, values, tables, lens, block_size, scale)
    assert out.dtype == dtype and out.shape == q.shape
    # float32: e^x by a polynomial (relative error < 1e-7) and sums in another order;
    # 16 bits: both round the same float32 value once.
    tol = 2e-6 if dtype == torch.float32 else (2**-8 if dtype == torch.bfloat16 else 2**-11)
    torch.testing.assert_close(out.float(), expected.float(), rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rows_of_one_sequence_attend_their_own_contexts(backend, dtype):
    """Speculative verification's rows: one block table, contexts s + 1 .. s + k (the kernel
    reads each key once for all of them: 5 rows of 3 query heads, 15 states a KV head)."""
    q, keys, values, tables, _ = _paged_case(dtype, [70] * 5, 9, 3, 64, 16, 21)
    tables = tables[:1].expand(5, -1).contiguous()
    lens = torch.arange(66, 71, dtype=torch.int32)
    out = cpu_layer_ops.paged_decode_attention(
        backend, q, keys, values, tables, lens, 16, 0.125, 70
    )
    expected = paged_decode_attention_reference(q, keys, values, tables, lens, 16, 0.125)
    tol = 2e-6 if dtype == torch.float32 else (2**-8 if dtype == torch.bfloat16 else 2**-11)
    torch.testing.assert_close(out.float(), expected.float(), rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "runs, num_heads, num_kv_heads, head_dim, block_size, q_scale",
    [
        ([(300, 8)], 9, 3, 64, 16, 1.0),  # 24 states a KV head: two passes of 16
        ([(700, 5)], 9, 3, 64, 16, 8.0),  # partitions; scores far apart: the reference moves
        ([(90, 3)], 4, 1, 32, 7, 1.0),  # head_dim 32; blocks of 7: keys copied, not in a row
        ([(100, 3), (50, 1), (300, 6)], 8, 2, 64, 8, 1.0),  # runs beside a single row
    ],
)
def test_runs_of_rows_match_reference(
    backend, dtype, runs, num_heads, num_kv_heads, head_dim, block_size, q_scale
):
    """Verification rows of several sequences (contexts s + 1 .. s + k each): in bfloat16 with
    head_dim 32 or 64 on an AMX CPU, the tile path (`decode_attention_tiles.cpp`)."""
    max_blocks = -(-max(context for context, _ in runs) // block_size)
    num_blocks = max_blocks * len(runs) + 3
    pool = _random((num_blocks * block_size, 2, num_kv_heads, head_dim), dtype, 24)
    keys, values = pool[:, 0], pool[:, 1]
    order = torch.randperm(num_blocks, generator=torch.Generator().manual_seed(25))
    tables, lens = [], []
    for r, (context, rows) in enumerate(runs):
        table = order[r * max_blocks : (r + 1) * max_blocks]
        tables += [table] * rows
        lens += range(context - rows + 1, context + 1)
    tables = torch.stack(tables).to(torch.int32).contiguous()
    lens = torch.tensor(lens, dtype=torch.int32)
    q = _random((len(lens), num_heads, head_dim), dtype, 26) * q_scale
    out = cpu_layer_ops.paged_decode_attention(
        backend, q, keys, values, tables, lens, block_size, head_dim**-0.5, int(lens.max())
    )
    expected = paged_decode_attention_reference(
        q, keys, values, tables, lens, block_size, head_dim**-0.5
    )
    # float32: e^s rounds relative to |s|, q_scale times larger here; 16 bits: one rounding
    tol = {torch.float32: 2e-6 * q_scale, torch.bfloat16: 2**-8, torch.float16: 2**-11}[dtype]
    torch.testing.assert_close(out.float(), expected.float(), rtol=tol, atol=tol)


def test_decode_attention_of_one_key_is_its_value(backend):
    q, keys, values, tables, lens = _paged_case(torch.float32, [1], 6, 2, 16, 4, 9)
    out = cpu_layer_ops.paged_decode_attention(backend, q, keys, values, tables, lens, 4, 0.25, 1)
    slot = int(tables[0, 0]) * 4
    expected = values[slot].repeat_interleave(3, dim=0)  # each KV head's value for its 3 q heads
    torch.testing.assert_close(out[0], expected, rtol=0, atol=0)


def test_argument_errors_name_the_argument(backend):
    q, keys, values, tables, lens = _paged_case(torch.float32, [5], 4, 2, 16, 4, 11)
    with pytest.raises(KernelArgumentError, match="context_lens has dtype int64"):
        cpu_layer_ops.paged_decode_attention(backend, q, keys, values, tables, lens.long(), 4, 1, 5)
    with pytest.raises(KernelArgumentError, match="max_context_len 9 must be in 1..max_blocks"):
        cpu_layer_ops.paged_decode_attention(backend, q, keys, values, tables, lens, 4, 1.0, 9)
    with pytest.raises(KernelArgumentError, match="key_cache has dtype bfloat16"):
        cpu_layer_ops.paged_decode_attention(
            backend, q, keys.bfloat16(), values, tables, lens, 4, 1.0, 5
        )
    x = _random((2, 8), torch.float32, 12)
    with pytest.raises(KernelArgumentError, match="weight must have shape"):
        cpu_layer_ops.rms_norm(backend, x, torch.ones(7), 1e-5)
    with pytest.raises(KernelArgumentError, match="x must be contiguous in its last dim"):
        cpu_layer_ops.rms_norm(backend, x.t(), torch.ones(2), 1e-5)
    cos_sin = torch.zeros(4, 2, 2)
    with pytest.raises(KernelArgumentError, match="positions has dtype int32"):
        cpu_layer_ops.rope_(backend, x, torch.zeros(2, dtype=torch.int32), cos_sin, 4)
    with pytest.raises(KernelArgumentError, match=r"cos_sin must be \[P, 3, 2\]"):
        cpu_layer_ops.rope_(
            backend, _random((2, 12), torch.float32, 13), torch.zeros(2).long(), cos_sin, 6
        )


def test_the_cpu_path_does_not_import_triton():
    """Importing Triton costs ~0.1 s and, at exit, prints nanobind leak reports to stderr (seen
    with triton 3.9): the engine's CPU path imports no Triton kernel module."""
    code = (
        "import sys, llmbench.engine.engine, llmbench.harness.run; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'triton'))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
