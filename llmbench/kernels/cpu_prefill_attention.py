"""Causal prefill attention on the C++ extension (`csrc/prefill_attention.cpp`): a prompt's query
rows over their context on Intel's AMX tiles, flash-style, computed transposed (S^T = K·Q^T, the
softmax down each query's column, O^T += V^T·P^T); on a CPU without the tiles, with AVX-512 BF16
dot products (`csrc/prefill_attention_vectors.cpp`) — checked, its float64 reference, its cost.

    out[i, h] = Σ_j softmax_j(scale · q[i, h] · k[j, h // g]) · v[j, h // g],  j ≤ offset + i

q [L, nh, d], k and v [C, nkv, d] (bfloat16), query i at position offset + i (offset = C − L:
0 for a fresh prompt, the cached prefix for a later chunk), g = nh / nkv. The engine calls it
for prefill chunks of a bfloat16 model whose head_dim the tiles take (`TILE_HEAD_DIMS`) on an
extension built with AMX, or the vectors (`VECTOR_HEAD_DIMS`) on one built with AVX-512 BF16 and
no AMX (`available`); inside, an OS that refuses the tiles gets the vectors, another head_dim
torch's SDPA.
"""

from __future__ import annotations

import torch

from llmbench.kernels.checks import CPU, check_shape, check_tensor, check_value
from llmbench.kernels.cost import KernelCost
from llmbench.kernels.cpu_extension import CpuExtension

OP = "prefill_attention"
TILE_HEAD_DIMS = (32, 64)  # O^T of 16 queries in at most four tiles
VECTOR_HEAD_DIMS = (32, 64, 128)  # o of the task's rows in 16 vector registers


def available(backend: CpuExtension, head_dim: int) -> bool:
    """Whether the engine calls the op: an extension built with AMX and a head_dim the tiles
    take, or built with AVX-512 BF16 but not AMX and a head_dim the vectors take. (Where the
    tiles are, torch's SDPA uses them too, and is faster than the vectors.)"""
    isa = backend.isa or ""
    if not backend.is_extension:
        return False
    if "amx" in isa:
        return head_dim in TILE_HEAD_DIMS
    return "bf16" in isa and head_dim in VECTOR_HEAD_DIMS


def prefill_attention(
    backend: CpuExtension,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: float,
    offset: int,
) -> torch.Tensor:
    """q [L, nh, d] over k, v [C, nkv, d] (bfloat16, each head's d contiguous) → [L, nh, d],
    checked (another d runs torch's SDPA inside the op)."""
    dtypes = (torch.bfloat16,)
    check_tensor(OP, "q", q, "[L, nh, d]", dtypes, 1, CPU)
    length, num_heads, head_dim = q.shape
    check_tensor(OP, "k", k, "[C, nkv, d]", dtypes, 1, CPU)
    context, num_kv_heads = k.shape[:2]
    check_shape(OP, "k", k, (context, num_kv_heads, head_dim), "[C, nkv, d]")
    check_tensor(OP, "v", v, "[C, nkv, d]", dtypes, 1, CPU)
    check_shape(OP, "v", v, tuple(k.shape), "[C, nkv, d]")
    check_value(OP, num_heads % num_kv_heads == 0, "nh must be a multiple of nkv")
    check_value(OP, length > 0 and offset == context - length, f"offset {offset} must be C − L")
    check_value(OP, backend.is_extension, f"the C++ extension is not in use ({backend.reason})")
    return backend.op(OP)(q, k, v, scale, offset)


def prefill_attention_reference(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, offset: int
) -> torch.Tensor:
    """The same attention in float64, rounded once to q's dtype."""
    length, num_heads, _ = q.shape
    group = num_heads // k.shape[1]
    keys = k.double().repeat_interleave(group, dim=1).transpose(0, 1)  # [nh, C, d]
    values = v.double().repeat_interleave(group, dim=1).transpose(0, 1)
    scores = scale * q.double().transpose(0, 1) @ keys.transpose(1, 2)  # [nh, L, C]
    position = torch.arange(length)[:, None] + offset
    scores = scores.masked_fill(torch.arange(k.shape[0])[None, :] > position, float("-inf"))
    return (torch.softmax(scores, dim=-1) @ values).transpose(0, 1).to(q.dtype)


def prefill_attention_cost(
    length: int, context: int, num_heads: int, num_kv_heads: int, head_dim: int
) -> KernelCost:
    """Bytes and FLOPs of one call (bfloat16).

    Formula: bytes = 2·(2·L·nh·d + 2·C·nkv·d) (q and out; k and v, read once);
    flops = 4·nh·d·Σ_i (C − L + i + 1) (q·k and p·v over the keys each row sees)."""
    seen = length * (context - length) + length * (length + 1) // 2
    return KernelCost(
        2 * (2 * length * num_heads * head_dim + 2 * context * num_kv_heads * head_dim),
        4 * num_heads * head_dim * seen,
    )
