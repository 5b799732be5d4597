"""llmbench.kernels.rope: the Triton kernel against its reference on interleaved pairs, the
reference against the engine's complex-multiply RoPE (Llama-3 scaling included), the cost by
hand, and the launcher's layout errors."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from llmbench.engine.config import RopeScaling
from llmbench.engine.model import Rotary, apply_rope_, rope_inv_freq
from llmbench.engine.presets import PRESETS
from llmbench.kernels.cost import KernelCost
from llmbench.kernels.errors import KernelArgumentError
from llmbench.kernels.rope import cos_sin_tables, rope_, rope_cost, rope_reference_

TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}
LLAMA3 = RopeScaling(
    factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=64
)


def rotary_tables(head_dim: int, num_positions: int, scaling: RopeScaling | None = None):
    config = dataclasses.replace(
        PRESETS["tiny"], head_dim=head_dim, rope_theta=500000.0, rope_scaling=scaling
    )
    return cos_sin_tables(rope_inv_freq(config), num_positions), config


def strided_x(num_tokens, width, dtype, device, seed=0):
    """x [T, width] as the q/k columns of a wider fused qkv matrix (rows strided)."""
    g = torch.Generator().manual_seed(seed)
    qkv = torch.randn(num_tokens, width + 24, generator=g).to(dtype).to(device)
    return qkv[:, :width]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize(("num_tokens", "num_heads", "head_dim"), [(4, 6, 16), (3, 20, 64)])
def test_kernel_matches_reference(dtype, num_tokens, num_heads, head_dim, device):
    (cos, sin), _ = rotary_tables(head_dim, 300, LLAMA3)
    cos, sin = cos.to(device), sin.to(device)
    x = strided_x(num_tokens, num_heads * head_dim, dtype, device)
    positions = torch.tensor([0, 299, 77, 5][:num_tokens], device=device)
    expected = x.clone()
    rope_reference_(expected, positions, cos, sin, head_dim)
    rope_(x, positions, cos, sin, head_dim)
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(x, expected, atol=tol, rtol=tol)


@pytest.mark.parametrize("scaling", [None, LLAMA3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_reference_matches_the_engines_rope(scaling, dtype):
    (cos, sin), config = rotary_tables(32, 200, scaling)
    table = Rotary(config, torch.device("cpu")).rotations(199)  # complex [P, d/2]
    torch.testing.assert_close(cos, table.real[:200], atol=1e-6, rtol=0)
    torch.testing.assert_close(sin, table.imag[:200], atol=1e-6, rtol=0)
    x = strided_x(5, 3 * 32, dtype, torch.device("cpu"), seed=2)
    positions = torch.tensor([3, 0, 150, 199, 64])
    expected = x.clone()
    apply_rope_(expected, table[positions].unsqueeze(1), 32)
    rope_reference_(x, positions, cos, sin, 32)
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(x, expected, atol=tol, rtol=tol)


def test_llama3_scaling_changes_the_low_frequencies_only():
    (_, sin), _ = rotary_tables(32, 100)
    (_, sin_scaled), _ = rotary_tables(32, 100, LLAMA3)
    assert torch.equal(sin[:, 0], sin_scaled[:, 0])  # the highest frequency is kept
    # the lowest is divided by the factor 8: sin(p·f/8) ≈ sin(p·f)/8 for these tiny angles
    torch.testing.assert_close(sin_scaled[99, -1] * 8, sin[99, -1], rtol=1e-4, atol=0)


def test_cost_by_hand():
    # T = 2 tokens, W = 3 heads · d 4 = 12, float16: x read + written 2·2·12·2 = 96 B; cos and
    # sin rows 2·2·(4/2)·4 = 32 B; int64 positions 2·8 = 16 B → 144 B.
    # FLOPs: 6 per pair (4 mul, 2 add), 6 pairs a token, 2 tokens → 72 = 3·T·W.
    assert rope_cost(2, 12, 4, "float16") == KernelCost(bytes=144, flops=72)
    assert rope_cost(2, 12, 4, "float16", index_dtype=torch.int32).bytes == 144 - 8


def test_layout_errors_are_one_line(device):
    (cos, sin), _ = rotary_tables(16, 10)
    cos, sin = cos.to(device), sin.to(device)
    x = torch.randn(3, 32, device=device)
    positions = torch.tensor([0, 1, 2], device=device)
    with pytest.raises(KernelArgumentError, match="rope: x's width 32 must be a multiple of an"):
        rope_(x, positions, cos, sin, 12)
    with pytest.raises(KernelArgumentError, match=r"rope: x must be contiguous in its last dim"):
        rope_(torch.randn(32, 3, device=device).t(), positions, cos, sin, 16)
    with pytest.raises(KernelArgumentError, match=r"rope: cos must be \[P, d/2\] = \[P, 8\]"):
        rope_(x, positions, cos[:, :4].contiguous(), sin, 16)
    with pytest.raises(KernelArgumentError, match="rope: sin has dtype float16; pass float32"):
        rope_(x, positions, cos, sin.half(), 16)
    with pytest.raises(KernelArgumentError, match="rope: positions has dtype float32; pass int32"):
        rope_(x, positions.float(), cos, sin, 16)


@pytest.mark.gpu
def test_bfloat16_llama3_shapes_on_the_gpu():
    (cos, sin), _ = rotary_tables(128, 8192, LLAMA3)
    cos, sin = cos.cuda(), sin.cuda()
    x = strided_x(64, 40 * 128, torch.bfloat16, torch.device("cuda"))
    positions = torch.randint(0, 8192, (64,), device="cuda")
    expected = x.clone()
    rope_reference_(expected, positions, cos, sin, 128)
    rope_(x, positions, cos, sin, 128)
    torch.testing.assert_close(x, expected, atol=2e-2, rtol=2e-2)
