"""The extension's prefill attention (`kernels.cpu_prefill_attention`) against its float64
reference: fresh prompts and later chunks, grouped heads, partial blocks of rows and keys, scores
large enough to move the running max; its checks and its cost. The AMX tiles run on this
machine's and CI's Intel Xeon (head_dim 128: torch's SDPA inside the op); the AVX-512 BF16
vectors on a CPU without them, and in CI through test_cpu_lesser_isa.py's build."""

from __future__ import annotations

import pytest
import torch

from llmbench.kernels import cpu_extension, cpu_prefill_attention
from llmbench.kernels.errors import KernelArgumentError

# (L, C, nh, nkv, d): a row, rows in one partial block, several blocks with a partial one, a
# later chunk over a cached prefix, grouped heads, d 32 and 64 (the tiles) and 128 (SDPA on
# the tiles' build, the vectors on one without them)
SHAPES = [
    (1, 1, 2, 1, 64),
    (5, 5, 2, 1, 64),
    (37, 37, 9, 3, 64),
    (16, 16, 4, 2, 32),
    (20, 50, 4, 4, 64),
    (1, 40, 2, 1, 32),
    (100, 300, 6, 2, 64),
    (20, 50, 4, 2, 128),
    (45, 45, 2, 1, 128),
]


@pytest.fixture(scope="module")
def backend() -> cpu_extension.CpuExtension:
    return cpu_extension.default()


def _inputs(shape, seed, q_scale=1.0):
    length, context, num_heads, num_kv_heads, head_dim = shape
    g = torch.Generator().manual_seed(seed)
    q = (torch.randn(length, num_heads, head_dim, generator=g) * q_scale).bfloat16()
    kv = torch.randn(context, 2, num_kv_heads, head_dim, generator=g).bfloat16()
    return q, kv[:, 0], kv[:, 1]  # k and v strided, as the engine passes a step's fresh K/V


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("q_scale", [1.0, 8.0])  # 8: scores far apart, the max moves by > 8
def test_it_matches_the_float64_reference(backend, shape, q_scale):
    q, k, v = _inputs(shape, 1, q_scale)
    scale, offset = shape[4] ** -0.5, shape[1] - shape[0]
    y = cpu_prefill_attention.prefill_attention(backend, q, k, v, scale, offset)
    expected = cpu_prefill_attention.prefill_attention_reference(q, k, v, scale, offset)
    assert y.shape == q.shape and y.dtype == torch.bfloat16 and torch.isfinite(y).all()
    # p rounded to bfloat16 before p·v (as torch's flash kernel does), the sum in float32:
    # within a few bfloat16 units of outputs of order 1.
    torch.testing.assert_close(y.float(), expected.float(), rtol=2e-2, atol=2e-2)


def test_the_engine_calls_it_where_the_tiles_or_the_vectors_take_the_head(backend):
    def build(isa):
        return cpu_extension.CpuExtension("extension", "x", isa, "ns")

    amx, bf16, vnni = build("avx512bf16_vnni_amx"), build("avx512bf16_vnni"), build("avx512_vnni")
    assert cpu_prefill_attention.available(amx, 64) and cpu_prefill_attention.available(amx, 32)
    assert not cpu_prefill_attention.available(amx, 128)  # SDPA on the tiles is faster there
    assert all(cpu_prefill_attention.available(bf16, d) for d in (32, 64, 128))
    assert not cpu_prefill_attention.available(bf16, 96)
    assert not cpu_prefill_attention.available(vnni, 64)  # no bfloat16 dot products
    assert not cpu_prefill_attention.available(cpu_extension.CpuExtension("torch", "x"), 64)


def test_argument_errors_name_the_argument(backend):
    q, k, v = _inputs((5, 5, 2, 1, 64), 2)
    with pytest.raises(KernelArgumentError, match="q has dtype float32"):
        cpu_prefill_attention.prefill_attention(backend, q.float(), k, v, 0.125, 0)
    with pytest.raises(KernelArgumentError, match="offset 1 must be C − L"):
        cpu_prefill_attention.prefill_attention(backend, q, k, v, 0.125, 1)
    with pytest.raises(KernelArgumentError, match="nh must be a multiple of nkv"):
        q3, k3, v3 = _inputs((5, 5, 3, 2, 64), 3)
        cpu_prefill_attention.prefill_attention(backend, q3, k3, v3, 0.125, 0)


def test_cost_counts_the_keys_each_row_sees():
    # 3 rows after 5 cached keys see 6, 7 and 8 keys: 21 dot products of d per head, twice
    cost = cpu_prefill_attention.prefill_attention_cost(3, 8, 4, 2, 64)
    assert cost.flops == 4 * 4 * 64 * (6 + 7 + 8)
    assert cost.bytes == 2 * (2 * 3 * 4 * 64 + 2 * 8 * 2 * 64)
