"""Roofline cost model: FLOPs and bytes of one engine step, napkin maths in code.

Torch-free. The model shape comes from `ModelConfig` (imported for type hints only, so this module
loads without the engine); the hardware peaks are plain data in `llmbench.roofline.ceilings`.

What is counted:

- weights once per step (every layer matrix, the norms, the lm_head); an untied embedding table
  only contributes the rows gathered for this step's tokens;
- in a mixture-of-experts layer, the dense part (attention, router, shared expert) once per step
  and only the experts the step's tokens were routed to: exactly when the engine says which
  (`StepShape.experts_touched`), else their expectation under uniform routing
  (`expected_experts_touched`); FLOPs count the top-k experts of every token;
- KV read per sequence (its whole context once per layer, not once per query) and KV written for
  every new token;
- the lm_head only for rows that need logits (with speculative decoding, every draft token's
  row too: the target checks them all), and a draft model's own passes apart (`draft_cost`);
- attention FLOPs as a function of each query's context length;
- bytes fetched over the host link (offloaded weights) apart from memory bytes: another roof;
- tensor parallelism as Megatron and vLLM shard: each of tp devices holds 1/tp of every matrix
  and of the query heads; KV heads split too, or, where tp exceeds them, each device holds one
  whole (replicated: its k_proj and v_proj columns and its K/V cache), `kv_heads_per_device`.

Activations (residual stream, MLP intermediates, logits) are *not* counted: at decode they are
O(T·h) per layer, tiny next to the weights; at prefill the step is compute-bound anyway.
Elementwise FLOPs (norms, RoPE, SiLU, softmax, bias adds) are ignored for the same reason.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
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

# The built-in engine's int8/int4 K/V caches keep one float16 scale per token and KV head.
KV_SCALE_BYTES = 2


def kv_bytes_per_elem(k_format: str, v_format: str, head_dim: int) -> float:
    """`StepShape.kv_bytes_per_elem` of a cache whose keys and values have their own storage
    formats (BYTES_PER_ELEM names), int8/int4 scales included as the engine stores them. K and
    V of a position are always read and written together, so their mean is exact.

    Formula: (b(k) + b(v)) / 2, b(f) = BYTES_PER_ELEM[f] (+ KV_SCALE_BYTES / head_dim for
    int8, int4).
    """

    def side(fmt: str) -> float:
        scale = KV_SCALE_BYTES / head_dim if fmt in ("int8", "int4") else 0.0
        return BYTES_PER_ELEM[fmt] + scale

    return (side(k_format) + side(v_format)) / 2


@dataclass(frozen=True)
class StepShape:
    """What one engine step computes, per device.

    `prefill`: per prefill sequence (start_position, num_new_tokens) — a chunk of a prompt that
    starts at `start_position` (0 for a fresh prompt, > 0 for a later chunk or a prefix hit).
    `decode_context_lens`: per decode sequence, its context length *including* the new token.
    `weight_bytes_per_param`: 4 fp32, 2 bf16, 1 int8, 0.625 for GGUF Q4_1 (5 bits).
    `kv_bytes_per_elem`: 2 for a 16-bit KV cache, 1 for int8, 4 for fp32; keys and values
    at different precisions (or with scales): their mean, `kv_bytes_per_elem()`.
    `tp`: tensor-parallel degree; the cost is reported per device.
    `experts_touched`: per MoE layer, the distinct experts the step's tokens were routed to (the
    engine's count); empty: the expectation under uniform routing. Ignored by a dense model.
    `link_bytes`: bytes fetched over the host link in the step (offloaded weights).
    `num_draft_tokens`: draft tokens verified (speculative decoding): each is a query row of its
    sequence's chunk, already in `prefill`, that needs logits too (k + 1 rows for k drafts).
    `lm_head_bytes_per_param`: the lm_head's own bytes per weight when it is stored apart from
    the layers (a quantised model: `loaded_bytes_per_param`); None: `weight_bytes_per_param`.
    """

    prefill: tuple[tuple[int, int], ...] = ()
    decode_context_lens: tuple[int, ...] = ()
    weight_bytes_per_param: float = 2.0
    kv_bytes_per_elem: float = 2.0
    tp: int = 1
    experts_touched: tuple[int, ...] = ()
    link_bytes: float = 0.0
    num_draft_tokens: int = 0
    lm_head_bytes_per_param: float | None = None

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
        if any(n < 0 for n in self.experts_touched) or self.link_bytes < 0:
            raise ValueError("experts_touched and link_bytes must be >= 0")
        if self.num_draft_tokens < 0:
            raise ValueError(f"num_draft_tokens {self.num_draft_tokens}: must be >= 0")
        if self.lm_head_bytes_per_param is not None and self.lm_head_bytes_per_param <= 0:
            raise ValueError("lm_head_bytes_per_param must be > 0")

    @property
    def num_tokens(self) -> int:
        """T: new prefill tokens plus one token per decode sequence."""
        return sum(n for _, n in self.prefill) + len(self.decode_context_lens)

    @property
    def num_logit_rows(self) -> int:
        """Rows that need logits: the last row of each prefill chunk, every decode row, and
        every verified draft token's row."""
        return len(self.prefill) + len(self.decode_context_lens) + self.num_draft_tokens


@dataclass(frozen=True)
class Cost:
    """FLOPs and bytes moved by one step on one device, with the terms that make them up.

    `breakdown` keys: `linear_flops`, `attention_flops`, `lm_head_flops` (sum to `flops`);
    `weight_bytes`, `expert_bytes`, `embedding_bytes`, `kv_read_bytes`, `kv_write_bytes`,
    `activation_bytes` (sum to `bytes`). `expert_bytes` are the routed experts read (0 for a
    dense model; `weight_bytes` holds every other weight). `link_bytes` cross the host link,
    a roof of their own: not part of `bytes`.
    """

    flops: float
    bytes: float
    breakdown: dict[str, float] = field(default_factory=dict)
    link_bytes: float = 0.0

    @property
    def arithmetic_intensity(self) -> float:
        """FLOPs per byte moved (FLOP/B); compare with a device's peak_flops / peak_bandwidth."""
        return self.flops / self.bytes if self.bytes else math.inf


def kv_heads_per_device(config: ModelConfig, tp: int) -> int:
    """KV heads each of `tp` devices holds: num_kv_heads / tp, or 1 where tp > num_kv_heads
    (each device then holds a whole KV head, replicated tp / num_kv_heads times).

    Raises ValueError where tp does not shard the heads evenly: tp must divide the query heads,
    and divide the KV heads or be a multiple of them (the rule vLLM enforces at start-up)."""
    heads, kv_heads = config.num_heads, config.num_kv_heads
    if tp < 1:
        raise ValueError(f"tp {tp}: must be >= 1")
    if heads % tp:
        raise ValueError(f"tp {tp}: does not divide the model's {heads} attention heads")
    if kv_heads % tp and tp % kv_heads:
        raise ValueError(
            f"tp {tp}: the model's {kv_heads} KV heads neither split evenly over {tp} devices nor "
            "replicate evenly on them (tp must divide them or be a multiple of them)"
        )
    return max(1, kv_heads // tp)


def kv_bytes_per_position(config: ModelConfig, kv_bytes_per_elem: float, tp: int = 1) -> float:
    """K and V of one position over every layer, on one of `tp` devices.

    Formula: 2 · head_dim · `kv_heads_per_device` · kv_bytes_per_elem · layers."""
    kv_heads = kv_heads_per_device(config, tp)
    return 2 * config.head_dim * kv_heads * kv_bytes_per_elem * config.num_layers


def replicated_kv_width(config: ModelConfig, tp: int) -> float:
    """Output columns of k_proj and v_proj that each device holds beyond a 1/tp share: 0, or
    where KV heads are replicated (tp > num_kv_heads), 2·d·(1 − num_kv_heads / tp)."""
    extra_heads = kv_heads_per_device(config, tp) - config.num_kv_heads / tp
    return 2 * config.head_dim * extra_heads


def _layer_params(config: ModelConfig) -> tuple[int, int, int]:
    """(matrix, bias, norm) parameters of one decoder layer that every token uses, the routed
    experts left out (`expert_params`); matches ModelConfig.num_active_params less the experts."""
    h, i = config.hidden_size, config.intermediate_size
    q, kv = config.q_size, config.kv_size
    matrix = h * (q + 2 * kv)  # q_proj, k_proj, v_proj: [h, q + 2·kv]
    matrix += q * h  # o_proj: [q, h]
    if config.num_experts:
        matrix += h * config.num_experts  # router (gate): [h, E]
        shared = config.shared_expert_intermediate_size
        if shared:
            matrix += 3 * h * shared  # shared expert: a SwiGLU MLP every token runs
            matrix += h  # shared_expert_gate: [h, 1] (Qwen2-MoE), scales its output
    else:
        matrix += 3 * h * i  # gate_proj, up_proj: [h, I]; down_proj: [I, h]
    bias = q + 2 * kv if config.qkv_bias else 0  # Qwen2 q/k/v bias, sharded with its heads
    norm = 2 * h  # input_layernorm + post_attention_layernorm weights
    if config.qk_norm:
        norm += 2 * config.head_dim  # q_norm, k_norm: one [head_dim] weight each (Qwen3)
    return matrix, bias, norm


def expert_params(config: ModelConfig) -> int:
    """Parameters of one routed expert: a SwiGLU MLP of `moe_intermediate_size` (0 when dense).

    Formula: 3 · h · I_moe (gate_proj, up_proj [h, I_moe]; down_proj [I_moe, h]).
    """
    return 3 * config.hidden_size * config.moe_intermediate_size if config.num_experts else 0


def expected_experts_touched(num_experts: int, top_k: int, num_tokens: float) -> float:
    """Expected distinct experts of one layer that `num_tokens` tokens are routed to, each token
    choosing `top_k` of `num_experts` uniformly at random (k different experts per token).

    Formula: E · (1 − (1 − k/E)^B). One token misses a given expert with probability
    (E−1 choose k) / (E choose k) = 1 − k/E; B independent tokens all miss it with
    (1 − k/E)^B; by linearity of expectation over the E experts.
    """
    if num_experts <= 0:
        return 0.0
    if not 0 < top_k <= num_experts:
        raise ValueError(f"top_k {top_k}: must be in 1..{num_experts}")
    return num_experts * (1.0 - (1.0 - top_k / num_experts) ** num_tokens)


def experts_touched(config: ModelConfig, step: StepShape) -> tuple[float, ...]:
    """Distinct routed experts per layer read by `step`: the engine's count when the step has
    one, else `expected_experts_touched` for its tokens in every layer; () for a dense model."""
    if not config.num_experts:
        return ()
    if step.experts_touched:
        if len(step.experts_touched) != config.num_layers:
            raise ValueError(
                f"experts_touched has {len(step.experts_touched)} layers, the model "
                f"{config.num_layers}"
            )
        return tuple(float(n) for n in step.experts_touched)
    expected = expected_experts_touched(
        config.num_experts, config.num_experts_per_tok, step.num_tokens
    )
    return (expected,) * config.num_layers


def step_cost(config: ModelConfig, step: StepShape) -> Cost:
    """FLOPs and bytes of one forward step of `config` over `step`, per device.

    Formula (per device, tp = step.tp, L layers, h hidden, q = heads·head_dim,
    kv = kv_heads·head_dim, I intermediate, V vocab, T tokens, R logit rows):
      linear_flops    = 2·T·L·(h·(q + 2kv) + q·h + 3·h·I) / tp
      attention_flops = 4·L·q·Σ keys attended by every query / tp
      lm_head_flops   = 2·R·h·V / tp
      weight_bytes    = bpp·(L·((matrices + qkv bias)/tp + 2h) + h) + bpp_lm·V·h/tp
                        (bpp_lm = lm_head_bytes_per_param, or bpp when None)
      embedding_bytes = bpp·T·h / tp        (untied only; tied: the table is the lm_head)
      kv_read_bytes   = Σ_seq context·2·d·kv_dev·kv_bytes·L
      kv_write_bytes  = T·2·d·kv_dev·kv_bytes·L
    where kv_dev = `kv_heads_per_device` (kv_heads / tp, or 1 where tp > kv_heads: each device
    then also holds r = `replicated_kv_width` more k/v columns, linear_flops += 2·T·L·h·r and
    weight_bytes += bpp·L·(h·r + r if qkv bias)).
    Mixture of experts (E experts, top-k, I_moe each, I_s shared, n_l experts touched in layer l):
    the matrices are h·(q + 2kv) + q·h + h·E (router) + 3·h·I_s + h (shared expert and its gate)
    instead of the dense MLP, plus per token k experts:
      linear_flops   += 2·T·L·k·3·h·I_moe / tp
      expert_bytes    = bpp·Σ_l n_l·3·h·I_moe / tp
    """
    tp = step.tp
    h, v, num_layers = config.hidden_size, config.vocab_size, config.num_layers
    bpp, kv_bytes = step.weight_bytes_per_param, step.kv_bytes_per_elem
    replicated = replicated_kv_width(config, tp)  # raises where tp does not shard the heads
    num_tokens, num_rows = step.num_tokens, step.num_logit_rows

    # --- FLOPs -------------------------------------------------------------------------------
    # A [T, a] @ [a, b] matmul is T·a·b multiply-adds = 2·T·a·b FLOPs; per layer the matrices
    # hold h·(q + 2kv) + q·h + 3·h·I weights, each used once per token. Column/row-parallel
    # sharding (Megatron) gives each device 1/tp of every matrix.
    matrix_params, bias_params, norm_params = _layer_params(config)
    # MoE: each token runs its top-k experts; a dense model has none (expert_params = 0).
    active_params = matrix_params + config.num_experts_per_tok * expert_params(config)
    linear_flops = 2 * num_tokens * num_layers * (active_params / tp + h * replicated)

    # Keys attended. Prefill chunk (s, n): query i sits at position s + i and (causally) sees
    # s + i + 1 keys, Σ_{i<n} (s + i + 1) = n·s + n(n+1)/2. Decode: the context length c.
    keys_attended = sum(n * s + n * (n + 1) // 2 for s, n in step.prefill)
    keys_attended += sum(step.decode_context_lens)
    # Per key, per head, per head_dim element: one multiply-add in QK^T and one in P·V = 4 FLOPs.
    # Query heads are split over tp devices (each device's KV heads serve its own query heads).
    attention_flops = 4 * num_layers * config.q_size * keys_attended / tp

    # lm_head [R, h] @ [h, V] only for rows that need logits; vocab-parallel over tp.
    lm_head_flops = 2 * num_rows * h * v / tp

    # --- bytes -------------------------------------------------------------------------------
    # Every weight is read once per step, whatever T is (that is why decode is bandwidth-bound).
    # Sharded matrices: 1/tp per device; RMSNorm weights are replicated.
    # Replicated KV heads: their k_proj and v_proj columns (and bias) on every device.
    replicated_params = h * replicated + (replicated if config.qkv_bias else 0)
    layer_bytes = (
        bpp * num_layers * ((matrix_params + bias_params) / tp + replicated_params + norm_params)
    )
    final_norm_bytes = bpp * h  # model.norm, replicated
    # lm_head (= the embedding table when tied, unless stored apart), vocab-parallel.
    lm_bpp = bpp if step.lm_head_bytes_per_param is None else step.lm_head_bytes_per_param
    lm_head_bytes = lm_bpp * v * h / tp
    weight_bytes = layer_bytes + final_norm_bytes + lm_head_bytes
    # An untied embedding table is not streamed: only the T gathered rows [T, h] are read (on
    # average T/tp of them fall in a device's vocab shard). Tied: already read as the lm_head.
    embedding_bytes = 0.0 if config.tie_word_embeddings else bpp * num_tokens * h / tp
    # Routed experts: only those the step's tokens reached, each read once (sharded like the
    # dense matrices). A batch of B decode tokens touches more of them than one token does, so
    # MoE decode bytes grow with the batch until every expert is read.
    expert_bytes = bpp * sum(experts_touched(config, step)) * expert_params(config) / tp

    # K and V of one position on one device: 2·d elements a KV head it holds, every layer.
    kv_elem_bytes = kv_bytes_per_position(config, kv_bytes, tp)
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
        "expert_bytes": float(expert_bytes),
        "embedding_bytes": float(embedding_bytes),
        "kv_read_bytes": float(kv_read_bytes),
        "kv_write_bytes": float(kv_write_bytes),
        "activation_bytes": activation_bytes,
    }
    flops = linear_flops + attention_flops + lm_head_flops
    total_bytes = weight_bytes + expert_bytes + embedding_bytes + kv_read_bytes + kv_write_bytes
    return Cost(
        flops=float(flops),
        bytes=float(total_bytes),
        breakdown=breakdown,
        link_bytes=float(step.link_bytes),
    )


def loaded_bytes_per_param(
    config: ModelConfig, weight_bytes: Mapping[str, float]
) -> tuple[float, float]:
    """(`weight_bytes_per_param`, `lm_head_bytes_per_param`) of a loaded model from the bytes
    its parts hold (`LlamaModel.weight_bytes`: `layers`, `final_norm`, `lm_head`, quantised
    codes, scales and zero points included), so that `step_cost`'s weight bytes are exactly
    what the model streams per step (tp = 1; an MoE model's experts get the layers' mean).

    Formula: bpp = (layers + final_norm) / (L·(matrices + bias + norms + E·expert) + h);
             bpp_lm = lm_head / (V·h).
    """
    matrix_params, bias_params, norm_params = _layer_params(config)
    per_layer = matrix_params + bias_params + norm_params
    per_layer += config.num_experts * expert_params(config)
    params = config.num_layers * per_layer + config.hidden_size  # + the final norm
    bpp = (weight_bytes["layers"] + weight_bytes["final_norm"]) / params
    return bpp, weight_bytes["lm_head"] / (config.vocab_size * config.hidden_size)


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


@dataclass(frozen=True)
class DraftModel:
    """A speculative draft model as the cost model sees it: its shape and how it is stored
    (`loaded_bytes_per_param` of the loaded draft; its own K/V cache's element size)."""

    config: ModelConfig
    weight_bytes_per_param: float
    kv_bytes_per_elem: float
    lm_head_bytes_per_param: float | None = None


def draft_cost(draft: DraftModel, passes: tuple[tuple[tuple[int, int], ...], ...]) -> Cost:
    """Cost of a speculative draft model's forward passes in one step: each pass is a step of
    its own (its weights read once per pass), every sequence in it a chunk of `query_len`
    tokens ending at `context_len` with one logit row.

    Formula: Σ_passes step_cost(draft, prefill = ((c - q, q) for (c, q) in pass)).
    """
    flops = total_bytes = 0.0
    breakdown: dict[str, float] = {}
    for rows in passes:
        shape = StepShape(
            prefill=tuple((c - q, q) for c, q in rows),
            weight_bytes_per_param=draft.weight_bytes_per_param,
            kv_bytes_per_elem=draft.kv_bytes_per_elem,
            lm_head_bytes_per_param=draft.lm_head_bytes_per_param,
        )
        cost = step_cost(draft.config, shape)
        flops += cost.flops
        total_bytes += cost.bytes
        for key, value in cost.breakdown.items():
            breakdown[key] = breakdown.get(key, 0.0) + value
    return Cost(flops=flops, bytes=total_bytes, breakdown=breakdown)


def time_bound_s(
    cost: Cost,
    peak_bytes_per_s: float,
    peak_flops_per_s: float,
    link_bytes_per_s: float | None = None,
) -> float:
    """The roofline: a step can go no faster than its bytes or its FLOPs allow, nor, with a
    host link, than its link bytes cross it.

    Formula: max(bytes / peak_bytes_per_s, flops / peak_flops_per_s,
                 link_bytes / link_bytes_per_s (only when a link bandwidth is given)).
    """
    bound = max(cost.bytes / peak_bytes_per_s, cost.flops / peak_flops_per_s)
    if link_bytes_per_s:
        bound = max(bound, cost.link_bytes / link_bytes_per_s)
    return bound


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
    flops(B) is linear in B; bytes(B) is affine plus, for MoE, the concave experts-touched term
    E·(1 − (1 − k/E)^B), so flops/peak − bytes/bw is convex and negative at B = 0: once it
    reaches 0 it stays above, the condition is monotone in B and a bisection finds the edge.
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
