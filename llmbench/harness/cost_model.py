"""Roofline cost model: FLOPs and bytes of one engine step, napkin maths in code.

Torch-free. The model shape comes from `ModelConfig` (imported for type hints only, so this module
loads without the engine); the hardware peaks are plain data in `llmbench.harness.hardware`.

What is counted:

- weights once per step (every layer matrix, the norms, the lm_head); an untied embedding table
  only contributes the rows gathered for this step's tokens;
- KV read per sequence (its whole context once per layer, not once per query) and KV written for
  every new token;
- the lm_head only for rows that need logits;
- attention FLOPs as a function of each query's context length.

Activations (residual stream, MLP intermediates, logits) are *not* counted: at decode they are
O(T·h) per layer, tiny next to the weights; at prefill the step is compute-bound anyway.
Elementwise FLOPs (norms, RoPE, SiLU, softmax, bias adds) are ignored for the same reason.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # type hints only: `llmbench report` must run without the engine
    from llmbench.engine.config import ModelConfig

# The largest decode batch `ridge_batch` looks at.
MAX_RIDGE_BATCH = 65_536

# GGUF block formats: (weights per block, bytes per block), from the format's block layout.
# Q4_0: 16 bytes of nibbles + f16 scale; Q4_1: + f16 min; Q5_*: + 4 bytes of high bits;
# Q8_0: 32 int8 + f16 scale; K-quants are super-blocks of 256 with packed sub-block scales.
GGUF_BLOCKS = {
    "q4_0": (32, 2 + 16),
    "q4_1": (32, 2 + 2 + 16),
    "q5_0": (32, 2 + 4 + 16),
    "q5_1": (32, 2 + 2 + 4 + 16),
    "q8_0": (32, 2 + 32),
    "q4_k": (256, 2 + 2 + 12 + 128),
    "q5_k": (256, 2 + 2 + 12 + 32 + 128),
    "q6_k": (256, 128 + 64 + 16 + 2),
}

# Bytes per weight or KV element of each storage format (plain int8/int4: scales ignored;
# GGUF formats: scales and mins included, from their block layout).
BYTES_PER_ELEM = {
    "float32": 4.0,
    "bfloat16": 2.0,
    "float16": 2.0,
    "fp8": 1.0,
    "int8": 1.0,
    "int4": 0.5,
    **{name: num_bytes / num_weights for name, (num_weights, num_bytes) in GGUF_BLOCKS.items()},
}


@dataclass(frozen=True)
class StepShape:
    """What one engine step computes, per device.

    `prefill`: per prefill sequence (start_position, num_new_tokens) — a chunk of a prompt that
    starts at `start_position` (0 for a fresh prompt, > 0 for a later chunk or a prefix hit).
    `decode_context_lens`: per decode sequence, its context length *including* the new token.
    `weight_bytes_per_param`: 4 fp32, 2 bf16, 1 int8, 0.625 for GGUF Q4_1 (5 bits).
    `kv_bytes_per_elem`: 2 for a 16-bit KV cache, 1 for int8, 4 for fp32.
    `tp`: tensor-parallel degree; the cost is reported per device.
    """

    prefill: tuple[tuple[int, int], ...] = ()
    decode_context_lens: tuple[int, ...] = ()
    weight_bytes_per_param: float = 2.0
    kv_bytes_per_elem: float = 2.0
    tp: int = 1

    def __post_init__(self) -> None:
        for start, num_new in self.prefill:
            if start < 0 or num_new < 1:
                raise ValueError(f"prefill chunk (start={start}, new={num_new}): need >= 0, >= 1")
        for context_len in self.decode_context_lens:
            if context_len < 1:
                raise ValueError(f"decode context length {context_len}: must be >= 1")
        if self.tp < 1:
            raise ValueError(f"tp {self.tp}: must be >= 1")
        if self.weight_bytes_per_param <= 0 or self.kv_bytes_per_elem <= 0:
            raise ValueError("weight_bytes_per_param and kv_bytes_per_elem must be > 0")

    @property
    def num_tokens(self) -> int:
        """T: new prefill tokens plus one token per decode sequence."""
        return sum(n for _, n in self.prefill) + len(self.decode_context_lens)

    @property
    def num_logit_rows(self) -> int:
        """Rows that need logits: the last row of each prefill chunk, every decode row."""
        return len(self.prefill) + len(self.decode_context_lens)


@dataclass(frozen=True)
class Cost:
    """FLOPs and bytes moved by one step on one device, with the terms that make them up.

    `breakdown` keys: `linear_flops`, `attention_flops`, `lm_head_flops` (sum to `flops`);
    `weight_bytes`, `embedding_bytes`, `kv_read_bytes`, `kv_write_bytes`, `activation_bytes`
    (sum to `bytes`).
    """

    flops: float
    bytes: float
    breakdown: dict[str, float] = field(default_factory=dict)

    @property
    def arithmetic_intensity(self) -> float:
        """FLOPs per byte moved (FLOP/B); compare with a device's peak_flops / peak_bandwidth."""
        return self.flops / self.bytes if self.bytes else math.inf


def _layer_params(config: ModelConfig) -> tuple[int, int, int]:
    """(matrix, bias, norm) parameters of one decoder layer (matches ModelConfig.num_params)."""
    h, i = config.hidden_size, config.intermediate_size
    q, kv = config.q_size, config.kv_size
    matrix = h * (q + 2 * kv)  # q_proj, k_proj, v_proj: [h, q + 2·kv]
    matrix += q * h  # o_proj: [q, h]
    matrix += 3 * h * i  # gate_proj, up_proj: [h, I]; down_proj: [I, h]
    bias = q + 2 * kv if config.qkv_bias else 0  # Qwen2 q/k/v bias, sharded with its heads
    norm = 2 * h  # input_layernorm + post_attention_layernorm weights
    return matrix, bias, norm


def step_cost(config: ModelConfig, step: StepShape) -> Cost:
    """FLOPs and bytes of one forward step of `config` over `step`, per device.

    Formula (per device, tp = step.tp, L layers, h hidden, q = heads·head_dim,
    kv = kv_heads·head_dim, I intermediate, V vocab, T tokens, R logit rows):
      linear_flops    = 2·T·L·(h·(q + 2kv) + q·h + 3·h·I) / tp
      attention_flops = 4·L·q·Σ keys attended by every query / tp
      lm_head_flops   = 2·R·h·V / tp
      weight_bytes    = bpp·(L·((matrices + qkv bias)/tp + 2h) + h + V·h/tp)
      embedding_bytes = bpp·T·h / tp        (untied only; tied: the table is the lm_head)
      kv_read_bytes   = Σ_seq context·2·kv·kv_bytes·L / tp
      kv_write_bytes  = T·2·kv·kv_bytes·L / tp
    """
    tp = step.tp
    h, v, num_layers = config.hidden_size, config.vocab_size, config.num_layers
    bpp, kv_bytes = step.weight_bytes_per_param, step.kv_bytes_per_elem
    num_tokens, num_rows = step.num_tokens, step.num_logit_rows

    # --- FLOPs -------------------------------------------------------------------------------
    # A [T, a] @ [a, b] matmul is T·a·b multiply-adds = 2·T·a·b FLOPs; per layer the matrices
    # hold h·(q + 2kv) + q·h + 3·h·I weights, each used once per token. Column/row-parallel
    # sharding (Megatron) gives each device 1/tp of every matrix.
    matrix_params, bias_params, norm_params = _layer_params(config)
    linear_flops = 2 * num_tokens * num_layers * matrix_params / tp

    # Keys attended. Prefill chunk (s, n): query i sits at position s + i and (causally) sees
    # s + i + 1 keys, Σ_{i<n} (s + i + 1) = n·s + n(n+1)/2. Decode: the context length c.
    keys_attended = sum(n * s + n * (n + 1) // 2 for s, n in step.prefill)
    keys_attended += sum(step.decode_context_lens)
    # Per key, per head, per head_dim element: one multiply-add in QK^T and one in P·V = 4 FLOPs.
    # Query heads are split over tp devices (kv heads with them). Napkin: everything divides
    # evenly; an engine with num_kv_heads < tp replicates kv heads, so KV bytes are then low.
    attention_flops = 4 * num_layers * config.q_size * keys_attended / tp

    # lm_head [R, h] @ [h, V] only for rows that need logits; vocab-parallel over tp.
    lm_head_flops = 2 * num_rows * h * v / tp

    # --- bytes -------------------------------------------------------------------------------
    # Every weight is read once per step, whatever T is (that is why decode is bandwidth-bound).
    # Sharded matrices: 1/tp per device; RMSNorm weights are replicated.
    layer_bytes = bpp * num_layers * ((matrix_params + bias_params) / tp + norm_params)
    final_norm_bytes = bpp * h  # model.norm, replicated
    lm_head_bytes = bpp * v * h / tp  # lm_head (= the embedding table when tied), vocab-parallel
    weight_bytes = layer_bytes + final_norm_bytes + lm_head_bytes
    # An untied embedding table is not streamed: only the T gathered rows [T, h] are read (on
    # average T/tp of them fall in a device's vocab shard). Tied: already read as the lm_head.
    embedding_bytes = 0.0 if config.tie_word_embeddings else bpp * num_tokens * h / tp

    # K and V of one position in one layer: 2·kv elements (kv heads split over tp).
    kv_elem_bytes = 2 * config.kv_size * kv_bytes * num_layers / tp
    # Read: each sequence's whole context once per layer (a fused attention kernel streams the
    # context once for all of its queries): prefill s + n positions, decode c positions.
    positions_read = sum(s + n for s, n in step.prefill) + sum(step.decode_context_lens)
    kv_read_bytes = positions_read * kv_elem_bytes
    # Written: the K and V of every new token.
    kv_write_bytes = num_tokens * kv_elem_bytes
    activation_bytes = 0.0  # ignored, see the module docstring

    breakdown = {
        "linear_flops": float(linear_flops),
        "attention_flops": float(attention_flops),
        "lm_head_flops": float(lm_head_flops),
        "weight_bytes": float(weight_bytes),
        "embedding_bytes": float(embedding_bytes),
        "kv_read_bytes": float(kv_read_bytes),
        "kv_write_bytes": float(kv_write_bytes),
        "activation_bytes": activation_bytes,
    }
    flops = linear_flops + attention_flops + lm_head_flops
    total_bytes = weight_bytes + embedding_bytes + kv_read_bytes + kv_write_bytes
    return Cost(flops=float(flops), bytes=float(total_bytes), breakdown=breakdown)


def decode_cost(
    config: ModelConfig,
    batch: int,
    context_len: int,
    weight_bytes_per_param: float,
    kv_bytes_per_elem: float,
    tp: int = 1,
) -> Cost:
    """Cost of one decode step of `batch` sequences, each at `context_len`."""
    step = StepShape(
        decode_context_lens=(context_len,) * batch,
        weight_bytes_per_param=weight_bytes_per_param,
        kv_bytes_per_elem=kv_bytes_per_elem,
        tp=tp,
    )
    return step_cost(config, step)


def time_bound_s(cost: Cost, peak_bytes_per_s: float, peak_flops_per_s: float) -> float:
    """The roofline: a step can go no faster than its bytes or its FLOPs allow.

    Formula: max(bytes / peak_bytes_per_s, flops / peak_flops_per_s).
    """
    return max(cost.bytes / peak_bytes_per_s, cost.flops / peak_flops_per_s)


def ridge_batch(
    config: ModelConfig,
    context_len: int,
    weight_bytes_per_param: float,
    kv_bytes_per_elem: float,
    peak_bytes_per_s: float,
    peak_flops_per_s: float,
    tp: int = 1,
) -> int | None:
    """Smallest decode batch whose step is compute-bound, or None if none up to 65,536.

    Formula: min B such that flops(B) / peak_flops_per_s >= bytes(B) / peak_bytes_per_s.
    flops(B) and bytes(B) are both affine in B and only bytes has a constant (the weights), so
    the condition is monotone in B and a bisection finds the edge.
    """

    def is_compute_bound(batch: int) -> bool:
        cost = decode_cost(
            config, batch, context_len, weight_bytes_per_param, kv_bytes_per_elem, tp
        )
        return cost.flops / peak_flops_per_s >= cost.bytes / peak_bytes_per_s

    if not is_compute_bound(MAX_RIDGE_BATCH):
        return None
    low, high = 0, MAX_RIDGE_BATCH  # invariant: low is not compute-bound (or 0), high is
    while high - low > 1:
        mid = (low + high) // 2
        if is_compute_bound(mid):
            high = mid
        else:
            low = mid
    return high
