"""A step's roofline cost split by op: the cost model's bytes and FLOPs, op by op, so that the
ops `llmbench profile` times add up to exactly the step the cost model costs.

Torch-free. The split follows `cost_model.step_cost` term by term (same weights, same KV, same
lm_head rows, nothing else): each linear layer gets its weight matrix (and bias) and its
2·T·in·out FLOPs, `rms_norm` every norm weight, `lm_head` its table and its logit rows,
`embedding` the gathered rows of an untied table, `kv_write` the new tokens' K/V, `attention`
the K/V it reads and its FLOPs. Ops the cost model charges nothing (RoPE, SiLU·mul, sampling,
the step's input tensors) get zero: their activations stay in cache at decode and a fused
engine hides them, so against the step's roofline all of their time is time lost.

What the kernels layer's cost functions (`llmbench.kernels.*_cost`) count besides — every
launch's activations read and written, index tensors — is `kernel_costs`: a second opinion
(what a GPU, whose kernels go to memory between launches, would move), not part of the step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from llmbench.roofline.cost_model import StepShape, replicated_kv_width, step_cost

if TYPE_CHECKING:  # type hints only: torch-free
    from llmbench.engine.config import ModelConfig

# The ops of one step, in forward order: what `profile_ops.classify` names each profiler
# event, and the rows of `llmbench profile`'s table.
OPS = (
    "schedule",  # the scheduler's plan for the step
    "inputs",  # the step's token ids, positions, KV slots, block tables, RoPE rotations
    "embedding",
    "rms_norm",
    "qkv_proj",
    "rope",
    "kv_write",
    "attention",
    "o_proj",
    "gate_up_proj",
    "silu_mul",
    "down_proj",
    "lm_head",
    "sampling",  # logits to float32, the sampler, the tokens to the host
    "outputs",  # the new tokens appended to their sequences, stops checked, the step recorded
)
LINEARS = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj", "lm_head")


@dataclass(frozen=True)
class OpCost:
    """Bytes and FLOPs one op moves and computes in a step, as the cost model counts them."""

    bytes: float = 0.0
    flops: float = 0.0


def op_costs(config: ModelConfig, step: StepShape) -> dict[str, OpCost]:
    """Every op of `OPS` → its share of `step_cost(config, step)` (a dense model).

    Formula (L layers, h hidden, q = heads·d, kv = kv_heads·d, I intermediate, V vocab,
    T tokens, R logit rows, bpp / bpp_lm / kvb bytes per weight / lm_head weight / K-V element,
    tp devices):
      qkv_proj      bytes bpp·L·(h·w + bias)/tp,         flops 2·T·L·h·w/tp
                    (w = q + 2kv + tp·r, r the k/v columns of replicated KV heads,
                    `replicated_kv_width`: 0 unless tp > kv_heads)
      o_proj        bytes bpp·L·q·h/tp,                  flops 2·T·L·q·h/tp
      gate_up_proj  bytes bpp·L·2·h·I/tp,                flops 2·T·L·2·h·I/tp
      down_proj     bytes bpp·L·I·h/tp,                  flops 2·T·L·I·h/tp
      rms_norm      bytes bpp·(L·(2h + 2d if qk_norm) + h)
      lm_head       bytes bpp_lm·V·h/tp,                 flops 2·R·h·V/tp
      embedding     bytes bpp·T·h/tp (untied only)
      kv_write      bytes T·2·d·kv_dev·kvb·L
      attention     bytes Σ positions read·2·d·kv_dev·kvb·L, flops 4·L·q·Σ keys attended/tp
    (kv_dev: `kv_heads_per_device`).
    Their sums are `step_cost`'s `bytes` and `flops` (a test holds them to it).
    """
    if config.num_experts:
        raise ValueError("op_costs: a mixture-of-experts model is not split by op")
    tp = step.tp
    h, q, kv = config.hidden_size, config.q_size, config.kv_size
    inter, num_layers = config.intermediate_size, config.num_layers
    bpp, num_tokens = step.weight_bytes_per_param, step.num_tokens

    def linear(num_in: int, num_out: int, bias: int = 0) -> OpCost:
        return OpCost(
            bytes=bpp * num_layers * (num_in * num_out + bias) / tp,
            flops=2 * num_tokens * num_layers * num_in * num_out / tp,
        )

    whole = step_cost(config, step).breakdown  # the terms that are not per-matrix
    qkv = q + 2 * kv + tp * replicated_kv_width(config, tp)  # a device holds qkv / tp of them
    norm_params = 2 * h + (2 * config.head_dim if config.qk_norm else 0)
    lm_bpp = bpp if step.lm_head_bytes_per_param is None else step.lm_head_bytes_per_param
    costs = {op: OpCost() for op in OPS}
    costs.update(
        qkv_proj=linear(h, qkv, qkv if config.qkv_bias else 0),
        o_proj=linear(q, h),
        gate_up_proj=linear(h, 2 * inter),
        down_proj=linear(inter, h),
        rms_norm=OpCost(bytes=bpp * (num_layers * norm_params + h)),
        lm_head=OpCost(bytes=lm_bpp * config.vocab_size * h / tp, flops=whole["lm_head_flops"]),
        embedding=OpCost(bytes=whole["embedding_bytes"]),
        kv_write=OpCost(bytes=whole["kv_write_bytes"]),
        attention=OpCost(bytes=whole["kv_read_bytes"], flops=whole["attention_flops"]),
    )
    return costs


def kernel_costs(
    config: ModelConfig, step: StepShape, dtype: str, block_size: int
) -> dict[str, OpCost]:
    """What the kernels layer's cost functions say the non-linear ops of `step` move and
    compute per step, activations included (every layer's launches): `rms_norm`, `rope`,
    `silu_mul`, `kv_write`, `attention` (decode sequences by the paged decode kernel, prefill
    chunks by the chunked-prefill kernel). Empty when the kernels layer is not importable."""
    try:
        from llmbench.kernels import (
            decode_attention,
            kv_cache_write,
            prefill_attention,
            rms_norm,
            rope,
            silu_and_mul,
        )
    except ImportError:
        return {}
    layers, tokens = config.num_layers, step.num_tokens
    h, d = config.hidden_size, config.head_dim
    num_rows = step.num_logit_rows
    norms = [rms_norm.rms_norm_cost(tokens, h, dtype)] * (2 * layers)
    norms.append(rms_norm.rms_norm_cost(num_rows, h, dtype))  # the final norm, logit rows only
    kv_dtype = _kv_dtype(step.kv_bytes_per_elem, dtype)
    attention = [
        decode_attention.paged_decode_attention_cost(
            step.decode_context_lens,
            config.num_heads,
            config.num_kv_heads,
            d,
            kv_dtype,
            block_size,
        )
    ] * (layers if step.decode_context_lens else 0)
    if step.prefill:
        attention += [
            prefill_attention.chunked_prefill_attention_cost(
                step.prefill,
                config.num_heads,
                config.num_kv_heads,
                d,
                kv_dtype,
                block_size,
            )
        ] * layers

    def total(launches: list) -> OpCost:
        return OpCost(sum(c.bytes for c in launches), sum(c.flops for c in launches))

    return {
        "rms_norm": total(norms),
        "rope": total([rope.rope_cost(tokens, config.q_size + config.kv_size, d, dtype)] * layers),
        "silu_mul": total(
            [silu_and_mul.silu_and_mul_cost(tokens, config.intermediate_size, dtype)] * layers
        ),
        "kv_write": total(
            [kv_cache_write.kv_cache_write_cost(tokens, config.num_kv_heads, d, dtype, kv_dtype)]
            * layers
        ),
        "attention": total(attention),
    }


def _kv_dtype(kv_bytes_per_elem: float, dtype: str) -> str:
    """The K/V cache's storage dtype name from its bytes per element (the model's dtype when
    the sizes agree)."""
    from llmbench.kernels.cost import dtype_bytes

    if dtype_bytes(dtype) == kv_bytes_per_elem:
        return dtype
    return {4.0: "float32", 2.0: "bfloat16", 1.0: "int8"}.get(kv_bytes_per_elem, dtype)
