"""What a checkpoint holds: tensors described before loading, the source protocol, and the
tensors a Llama-family config needs (dense or mixture-of-experts), checked by name and shape.

A source describes its tensors without loading them (so `llmbench inspect synthetic:llama-3.1-70b`
needs no 140 GB of memory), and loads them on demand as HF-named tensors in the engine's dtype:
`model.embed_tokens.weight`, `model.layers.{i}.self_attn.q_proj.weight`, ..., `lm_head.weight`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from llmbench.engine.config import ModelConfig
from llmbench.engine.tokenizer import Tokenizer
from llmbench.errors import UserError

if TYPE_CHECKING:  # torch is the engine extra: describing a model needs none
    import torch


@dataclass(frozen=True)
class TensorInfo:
    """One tensor as stored: its name in the file, shape, storage type and size on disk."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    num_bytes: int


class WeightSource(Protocol):
    """A model's weights, config and tokenizer, before anything is loaded."""

    description: str
    config: ModelConfig

    def tensor_infos(self) -> list[TensorInfo]: ...

    def load(self, dtype: torch.dtype, device: torch.device) -> dict[str, torch.Tensor]: ...

    def tokenizer(self) -> Tokenizer: ...


def expected_tensors(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor a Llama-family checkpoint holds, by HF name, with its [out, in] shape."""
    h, i = config.hidden_size, config.intermediate_size
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (config.vocab_size, h)}
    for layer in range(config.num_layers):
        p = f"model.layers.{layer}."
        shapes[p + "input_layernorm.weight"] = (h,)
        shapes[p + "self_attn.q_proj.weight"] = (config.q_size, h)
        shapes[p + "self_attn.k_proj.weight"] = (config.kv_size, h)
        shapes[p + "self_attn.v_proj.weight"] = (config.kv_size, h)
        if config.qkv_bias:
            shapes[p + "self_attn.q_proj.bias"] = (config.q_size,)
            shapes[p + "self_attn.k_proj.bias"] = (config.kv_size,)
            shapes[p + "self_attn.v_proj.bias"] = (config.kv_size,)
        shapes[p + "self_attn.o_proj.weight"] = (h, config.q_size)
        if config.qk_norm:
            shapes[p + "self_attn.q_norm.weight"] = (config.head_dim,)
            shapes[p + "self_attn.k_norm.weight"] = (config.head_dim,)
        shapes[p + "post_attention_layernorm.weight"] = (h,)
        if config.is_moe:
            shapes.update(_moe_tensors(config, p + "mlp."))
        else:
            shapes[p + "mlp.gate_proj.weight"] = (i, h)
            shapes[p + "mlp.up_proj.weight"] = (i, h)
            shapes[p + "mlp.down_proj.weight"] = (h, i)
    shapes["model.norm.weight"] = (h,)
    if not config.tie_word_embeddings:
        shapes["lm_head.weight"] = (config.vocab_size, h)
    return shapes


def _moe_tensors(config: ModelConfig, prefix: str) -> dict[str, tuple[int, ...]]:
    """One MoE layer's tensors (Qwen-MoE names; Mixtral's are renamed to these on load)."""
    h, moe_i = config.hidden_size, config.moe_intermediate_size
    shapes: dict[str, tuple[int, ...]] = {prefix + "gate.weight": (config.num_experts, h)}
    for e in range(config.num_experts):
        shapes[f"{prefix}experts.{e}.gate_proj.weight"] = (moe_i, h)
        shapes[f"{prefix}experts.{e}.up_proj.weight"] = (moe_i, h)
        shapes[f"{prefix}experts.{e}.down_proj.weight"] = (h, moe_i)
    shared_i = config.shared_expert_intermediate_size
    if shared_i:
        shapes[prefix + "shared_expert.gate_proj.weight"] = (shared_i, h)
        shapes[prefix + "shared_expert.up_proj.weight"] = (shared_i, h)
        shapes[prefix + "shared_expert.down_proj.weight"] = (h, shared_i)
        shapes[prefix + "shared_expert_gate.weight"] = (1, h)
    return shapes


def check_tensors(tensors: dict[str, torch.Tensor], config: ModelConfig, source: str) -> None:
    """Refuse a checkpoint whose tensors are missing or the wrong shape for its config."""
    for name, shape in expected_tensors(config).items():
        if name not in tensors:
            raise UserError(f"{source}: tensor '{name}' is missing; the checkpoint is incomplete")
        if tuple(tensors[name].shape) != shape:
            raise UserError(
                f"{source}: tensor '{name}' has shape {tuple(tensors[name].shape)}, "
                f"config says {shape}"
            )
