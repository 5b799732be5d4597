"""`ModelConfig`: the shape of a Llama-family decoder, whatever file it came from.

Every weight source (HF folder, GGUF, synthetic preset) produces one of these; the model, the
KV cache and the cost model read nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass

from llmbench.errors import UserError


@dataclass(frozen=True)
class RopeScaling:
    """Llama-3 style RoPE frequency scaling (`rope_type: llama3` in HF configs)."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int


@dataclass(frozen=True)
class ModelConfig:
    """Hyper-parameters of a Llama-family decoder (RMSNorm, RoPE, GQA, SwiGLU)."""

    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    max_position_embeddings: int
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling | None = None
    rms_norm_eps: float = 1e-5
    tie_word_embeddings: bool = False
    # Qwen2 puts a bias on q/k/v (not on o_proj); Llama has none.
    qkv_bias: bool = False
    # Mixture of experts: every layer's MLP is `num_experts` SwiGLU experts of width
    # `moe_intermediate_size`, each token runs the top `num_experts_per_tok` of them (and a
    # shared expert when `shared_expert_intermediate_size` > 0). 0 experts: a dense SwiGLU MLP
    # of `intermediate_size` per layer (which an MoE model does not use).
    num_experts: int = 0
    num_experts_per_tok: int = 0  # top-k
    moe_intermediate_size: int = 0  # each expert's SwiGLU width
    shared_expert_intermediate_size: int = 0  # 0: no shared expert (Qwen2-MoE has one, gated)
    router_scoring: str = "softmax"  # softmax | sigmoid over the router logits
    norm_topk_prob: bool = True  # renormalise the top-k routing weights to sum to 1
    qk_norm: bool = False  # RMSNorm on q and k per head, before RoPE (Qwen3)

    def __post_init__(self) -> None:
        for name in (
            "vocab_size",
            "hidden_size",
            "num_layers",
            "num_heads",
            "num_kv_heads",
            "head_dim",
            "intermediate_size",
            "max_position_embeddings",
        ):
            if getattr(self, name) <= 0:
                raise UserError(f"model config: {name} must be > 0, got {getattr(self, name)}")
        if self.num_heads % self.num_kv_heads:
            raise UserError(
                f"model config: num_heads ({self.num_heads}) must be a multiple of "
                f"num_kv_heads ({self.num_kv_heads})"
            )
        if self.num_experts < 0:
            raise UserError(f"model config: num_experts must be >= 0, got {self.num_experts}")
        if self.is_moe:
            if not 0 < self.num_experts_per_tok <= self.num_experts:
                raise UserError(
                    f"model config: num_experts_per_tok must be in 1..{self.num_experts}, "
                    f"got {self.num_experts_per_tok}"
                )
            if self.moe_intermediate_size <= 0 or self.shared_expert_intermediate_size < 0:
                raise UserError(
                    "model config: an MoE model needs moe_intermediate_size > 0 and "
                    "shared_expert_intermediate_size >= 0"
                )
            if self.router_scoring not in ("softmax", "sigmoid"):
                raise UserError(
                    f"model config: router_scoring must be softmax or sigmoid, "
                    f"got {self.router_scoring!r}"
                )
        elif self.num_experts_per_tok or self.moe_intermediate_size:
            raise UserError(
                "model config: num_experts_per_tok / moe_intermediate_size need num_experts > 0"
            )
        elif self.shared_expert_intermediate_size:
            raise UserError("model config: a shared expert needs num_experts > 0")

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def is_moe(self) -> bool:
        """True when every layer's MLP is a routed mixture of experts."""
        return self.num_experts > 0

    def num_params(self) -> int:
        """Parameter count, napkin maths: embeddings + per-layer attention/MLP/norms + lm_head.

        An MoE layer counts its router, every expert and the shared expert (what must be stored).
        """
        return self._count_params(self.num_experts)

    def num_active_params(self) -> int:
        """Parameters one token runs through: as `num_params`, with only its top-k experts.

        Equal to `num_params()` for a dense model.
        """
        return self._count_params(self.num_experts_per_tok)

    def _count_params(self, num_experts_counted: int) -> int:
        h, i = self.hidden_size, self.intermediate_size
        attn = h * (self.q_size + 2 * self.kv_size) + self.q_size * h
        if self.qkv_bias:
            attn += self.q_size + 2 * self.kv_size
        if self.qk_norm:
            attn += 2 * self.head_dim  # q_norm, k_norm: one [head_dim] weight each
        if self.is_moe:
            mlp = h * self.num_experts  # router: [E, h]
            mlp += num_experts_counted * 3 * h * self.moe_intermediate_size
            if self.shared_expert_intermediate_size:
                # The shared expert's gate/up/down, and its sigmoid gate [1, h].
                mlp += 3 * h * self.shared_expert_intermediate_size + h
        else:
            mlp = 3 * h * i  # gate_proj, up_proj, down_proj
        per_layer = attn + mlp + 2 * h  # + input and post-attention RMSNorm weights
        embed = self.vocab_size * h
        lm_head = 0 if self.tie_word_embeddings else self.vocab_size * h
        return embed + self.num_layers * per_layer + h + lm_head

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """K and V for one token across all layers."""
        return 2 * self.num_layers * self.kv_size * dtype_bytes


def _int(raw: dict, key: str, source: str) -> int:
    value = raw.get(key)
    if not isinstance(value, int) or isinstance(value, bool):
        raise UserError(f"{source}: '{key}' must be an integer, got {value!r}")
    return value


_DENSE_ARCHITECTURES = {"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM"}
_MOE_ARCHITECTURES = {"MixtralForCausalLM", "Qwen2MoeForCausalLM", "Qwen3MoeForCausalLM"}
# A config.json without `architectures` (written by hand, or by an old exporter) names its
# family by `model_type` alone, as transformers' AutoModelForCausalLM reads it.
_ARCHITECTURE_OF_MODEL_TYPE = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "mixtral": "MixtralForCausalLM",
    "qwen2_moe": "Qwen2MoeForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM",
}


def config_from_hf(raw: dict, source: str) -> ModelConfig:
    """Build a ModelConfig from an HF `config.json` dict (Llama, Mistral, Qwen2 families and
    the Mixtral, Qwen2-MoE, Qwen3-MoE mixtures of experts)."""
    supported = _DENSE_ARCHITECTURES | _MOE_ARCHITECTURES
    architectures = raw.get("architectures") or []
    if not architectures and raw.get("model_type") in _ARCHITECTURE_OF_MODEL_TYPE:
        architectures = [_ARCHITECTURE_OF_MODEL_TYPE[raw["model_type"]]]
    arch = next((a for a in architectures if a in supported), None)
    if arch is None:
        raise UserError(
            f"{source}: unsupported architecture {architectures or raw.get('model_type')!r}; "
            f"llmbench runs Llama-family decoders ({', '.join(sorted(supported))})"
        )
    hidden = _int(raw, "hidden_size", source)
    num_heads = _int(raw, "num_attention_heads", source)
    rope = raw.get("rope_scaling") or raw.get("rope_parameters") or {}
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    scaling = None
    if rope_type == "llama3":
        scaling = RopeScaling(
            factor=float(rope["factor"]),
            low_freq_factor=float(rope["low_freq_factor"]),
            high_freq_factor=float(rope["high_freq_factor"]),
            original_max_position_embeddings=int(rope["original_max_position_embeddings"]),
        )
    elif rope_type not in ("default", None):
        raise UserError(f"{source}: unsupported rope_scaling type {rope_type!r} (default, llama3)")
    rope_theta = raw.get("rope_theta", rope.get("rope_theta", 10000.0))
    if raw.get("attention_bias") or raw.get("mlp_bias"):
        raise UserError(f"{source}: attention_bias/mlp_bias on Llama layers is not supported")
    return ModelConfig(
        vocab_size=_int(raw, "vocab_size", source),
        hidden_size=hidden,
        num_layers=_int(raw, "num_hidden_layers", source),
        num_heads=num_heads,
        num_kv_heads=raw.get("num_key_value_heads") or num_heads,
        head_dim=raw.get("head_dim") or hidden // num_heads,
        intermediate_size=_int(raw, "intermediate_size", source),
        max_position_embeddings=raw.get("max_position_embeddings", 4096),
        rope_theta=float(rope_theta),
        rope_scaling=scaling,
        rms_norm_eps=float(raw.get("rms_norm_eps", 1e-5)),
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
        qkv_bias=arch == "Qwen2ForCausalLM"
        or (arch == "Qwen2MoeForCausalLM" and bool(raw.get("qkv_bias", True))),
        **(_moe_fields(raw, arch, source) if arch in _MOE_ARCHITECTURES else {}),
    )


def _moe_fields(raw: dict, arch: str, source: str) -> dict:
    """The MoE part of an HF config: experts, top-k, widths, routing, Qwen3's q/k norm.

    Mixtral always renormalises its top-k weights; the Qwen families say so in
    `norm_topk_prob` (absent: False, as in transformers).
    """
    if raw.get("use_sliding_window"):
        raise UserError(f"{source}: sliding-window attention is not supported")
    num_experts = raw.get("num_experts", raw.get("num_local_experts"))
    if not isinstance(num_experts, int) or isinstance(num_experts, bool) or num_experts <= 0:
        raise UserError(f"{source}: 'num_experts' must be a positive integer, got {num_experts!r}")
    top_k = _int(raw, "num_experts_per_tok", source)
    if arch == "MixtralForCausalLM":
        return dict(
            num_experts=num_experts,
            num_experts_per_tok=top_k,
            moe_intermediate_size=_int(raw, "intermediate_size", source),
            norm_topk_prob=True,
        )
    # Qwen2-MoE / Qwen3-MoE can interleave dense layers; llmbench runs all-MoE stacks.
    if raw.get("mlp_only_layers") or raw.get("decoder_sparse_step", 1) != 1:
        raise UserError(
            f"{source}: dense layers between MoE layers (mlp_only_layers / decoder_sparse_step "
            f"!= 1) are not supported"
        )
    shared = raw.get("shared_expert_intermediate_size", 0) if arch == "Qwen2MoeForCausalLM" else 0
    return dict(
        num_experts=num_experts,
        num_experts_per_tok=top_k,
        moe_intermediate_size=_int(raw, "moe_intermediate_size", source),
        shared_expert_intermediate_size=shared,
        norm_topk_prob=bool(raw.get("norm_topk_prob", False)),
        # `qk_norm` is llmbench's own key (a pruned tiny-moe: a shared expert and q/k norm).
        qk_norm=bool(raw.get("qk_norm", arch == "Qwen3MoeForCausalLM")),
    )
