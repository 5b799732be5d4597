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

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    def num_params(self) -> int:
        """Parameter count, napkin maths: embeddings + per-layer attention/MLP/norms + lm_head."""
        h, i = self.hidden_size, self.intermediate_size
        attn = h * (self.q_size + 2 * self.kv_size) + self.q_size * h
        if self.qkv_bias:
            attn += self.q_size + 2 * self.kv_size
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


def config_from_hf(raw: dict, source: str) -> ModelConfig:
    """Build a ModelConfig from an HF `config.json` dict (Llama, Mistral, Qwen2 families)."""
    supported = {"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM"}
    architectures = raw.get("architectures") or []
    if not any(a in supported for a in architectures):
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
        qkv_bias="Qwen2ForCausalLM" in architectures,
    )
