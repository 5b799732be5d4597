"""The Llama-family transformer, in forward order, over a flat batch of tokens.

One forward pass takes the tokens of every scheduled sequence concatenated (`T` rows: prefill
chunks and decode tokens alike), writes their K/V into the paged cache, and attends through each
sequence's block table. Shapes: T = tokens in the step, h = hidden size, nh / nkv = query / KV
heads, d = head_dim, V = vocab.

Weights are kept as plain tensors in HF layout ([out, in]); q/k/v and gate/up are fused into one
matrix each so a decode step runs 4 matmuls per layer instead of 7 (fewer passes over the
activations, fewer Python calls — decode on CPU is ~30 ms for the whole model).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from llmbench.engine.config import ModelConfig
from llmbench.engine.paged_attention import AttentionBatch, KVCache, paged_attention


@dataclass(frozen=True)
class _Layer:
    input_norm: torch.Tensor  # [h]
    qkv_proj: torch.Tensor  # [nh*d + 2*nkv*d, h]
    qkv_bias: torch.Tensor | None
    o_proj: torch.Tensor  # [h, nh*d]
    post_attention_norm: torch.Tensor  # [h]
    gate_up_proj: torch.Tensor  # [2*I, h]
    down_proj: torch.Tensor  # [h, I]


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm as HF Llama computes it: statistics in float32, scale in the model dtype."""
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(x.dtype)


def rope_inv_freq(config: ModelConfig) -> torch.Tensor:
    """Per-pair rotation frequencies [d/2], with Llama-3 long-context scaling when configured."""
    d = config.head_dim
    exponents = torch.arange(0, d, 2, dtype=torch.int64).float() / d
    inv_freq = 1.0 / (config.rope_theta**exponents)
    scaling = config.rope_scaling
    if scaling is None:
        return inv_freq
    # Llama 3.1: keep high frequencies, divide low ones by `factor`, interpolate in between.
    old_len = scaling.original_max_position_embeddings
    low_freq_wavelen = old_len / scaling.low_freq_factor
    high_freq_wavelen = old_len / scaling.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / scaling.factor, inv_freq)
    smooth = (old_len / wavelen - scaling.low_freq_factor) / (
        scaling.high_freq_factor - scaling.low_freq_factor
    )
    smoothed = (1 - smooth) * scaled / scaling.factor + smooth * scaled
    is_medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


class Rotary:
    """cos/sin tables [positions, d] in HF's half-split layout, grown on demand."""

    def __init__(self, config: ModelConfig, dtype: torch.dtype, device: torch.device):
        self.inv_freq = rope_inv_freq(config).to(device)
        self.dtype = dtype
        self.cos = torch.empty(0, config.head_dim, dtype=dtype, device=device)
        self.sin = torch.empty(0, config.head_dim, dtype=dtype, device=device)

    def tables(self, max_position: int) -> tuple[torch.Tensor, torch.Tensor]:
        if max_position >= self.cos.shape[0]:
            size = max(2 * self.cos.shape[0], max_position + 1, 256)
            t = torch.arange(size, dtype=torch.float32, device=self.inv_freq.device)
            freqs = torch.outer(t, self.inv_freq)  # [size, d/2]
            emb = torch.cat((freqs, freqs), dim=-1)  # [size, d]
            self.cos, self.sin = emb.cos().to(self.dtype), emb.sin().to(self.dtype)
        return self.cos, self.sin


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [T, heads, d]; cos/sin: [T, 1, d]. Rotates the two halves of each head (HF layout)."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class LlamaModel:
    """Forward pass of a Llama-family decoder over HF-named weights."""

    def __init__(self, config: ModelConfig, weights: dict[str, torch.Tensor]):
        self.config = config
        self.embed_tokens = weights["model.embed_tokens.weight"]  # [V, h]
        self.dtype = self.embed_tokens.dtype
        self.device = self.embed_tokens.device
        self.layers = [self._layer(weights, i) for i in range(config.num_layers)]
        self.norm = weights["model.norm.weight"]
        self.lm_head = (
            self.embed_tokens if config.tie_word_embeddings else weights["lm_head.weight"]
        )
        self.rotary = Rotary(config, self.dtype, self.device)
        self.scale = 1.0 / math.sqrt(config.head_dim)

    def _layer(self, w: dict[str, torch.Tensor], i: int) -> _Layer:
        p = f"model.layers.{i}."
        attn = p + "self_attn."
        qkv = [w[f"{attn}{name}_proj.weight"] for name in "qkv"]
        bias = None
        if self.config.qkv_bias:
            bias = torch.cat([w[f"{attn}{name}_proj.bias"] for name in "qkv"])
        return _Layer(
            input_norm=w[p + "input_layernorm.weight"],
            qkv_proj=torch.cat(qkv),
            qkv_bias=bias,
            o_proj=w[attn + "o_proj.weight"],
            post_attention_norm=w[p + "post_attention_layernorm.weight"],
            gate_up_proj=torch.cat([w[p + "mlp.gate_proj.weight"], w[p + "mlp.up_proj.weight"]]),
            down_proj=w[p + "mlp.down_proj.weight"],
        )

    def decode_weight_bytes(self) -> int:
        """Weight bytes one decode step reads: every matrix once, but of an untied embedding
        table only the one row it gathers (a tied table is read whole as the lm_head)."""
        tensors = [self.norm, self.lm_head]
        for layer in self.layers:
            tensors += [
                layer.input_norm,
                layer.qkv_proj,
                layer.o_proj,
                layer.post_attention_norm,
                layer.gate_up_proj,
                layer.down_proj,
            ]
            if layer.qkv_bias is not None:
                tensors.append(layer.qkv_bias)
        total = sum(t.numel() * t.element_size() for t in tensors)
        if self.lm_head is not self.embed_tokens:
            total += self.embed_tokens.shape[1] * self.embed_tokens.element_size()
        return total

    @torch.inference_mode()
    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        batch: AttentionBatch,
        kv_cache: KVCache,
    ) -> torch.Tensor:
        """input_ids, positions: [T] → hidden states [T, h] (before the final norm)."""
        cfg = self.config
        num_tokens = input_ids.shape[0]
        cos_table, sin_table = self.rotary.tables(batch.max_position)
        cos = cos_table[positions].unsqueeze(1)  # [T, 1, d]
        sin = sin_table[positions].unsqueeze(1)
        x = F.embedding(input_ids, self.embed_tokens)  # [T, h]
        for i, layer in enumerate(self.layers):
            # Attention block.
            residual = x
            x = rms_norm(x, layer.input_norm, cfg.rms_norm_eps)
            qkv = F.linear(x, layer.qkv_proj, layer.qkv_bias)  # [T, (nh + 2*nkv) * d]
            q, k, v = qkv.split([cfg.q_size, cfg.kv_size, cfg.kv_size], dim=-1)
            q = apply_rope(q.view(num_tokens, cfg.num_heads, cfg.head_dim), cos, sin)
            k = apply_rope(k.view(num_tokens, cfg.num_kv_heads, cfg.head_dim), cos, sin)
            v = v.view(num_tokens, cfg.num_kv_heads, cfg.head_dim)
            attn = paged_attention(q, k, v, kv_cache.layer(i), batch, self.scale)  # [T, nh, d]
            x = residual + F.linear(attn.reshape(num_tokens, cfg.q_size), layer.o_proj)
            # MLP block (SwiGLU).
            residual = x
            x = rms_norm(x, layer.post_attention_norm, cfg.rms_norm_eps)
            gate, up = F.linear(x, layer.gate_up_proj).chunk(2, dim=-1)  # [T, I] each
            x = residual + F.linear(F.silu(gate) * up, layer.down_proj)
        return x

    @torch.inference_mode()
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden: [N, h] rows that need a next token → logits [N, V] in float32."""
        return F.linear(rms_norm(hidden, self.norm, self.config.rms_norm_eps), self.lm_head).float()
