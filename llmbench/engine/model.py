"""The Llama-family transformer, in forward order, over a flat batch of tokens.

One forward pass takes the tokens of every scheduled sequence concatenated (`T` rows: prefill
chunks and decode tokens alike), writes their K/V into the paged cache, and attends through each
sequence's block table. Shapes: T = tokens in the step, h = hidden size, nh / nkv = query / KV
heads, d = head_dim, V = vocab.

Weights are kept as plain tensors in HF layout ([out, in]) with three load-time changes, each for
fewer operator calls per layer (on this 2-core CPU a call costs 4-30 us, and a SmolLM2 decode step
has 30 layers):
- q/k/v and gate/up are fused into one matrix each: 4 matmuls per layer instead of 7;
- within each q/k head the rows are reordered from HF's half-split RoPE layout to interleaved
  pairs, so RoPE is one in-place complex multiply (q·k is unchanged by a permutation applied to
  both, and V and the output are untouched);
- every matrix multiply goes through `Linear`, which keeps the weight in the layout MKL streams
  fastest and adds the residual inside the same `addmm` call.
"""

from __future__ import annotations

import contextlib
import math
import warnings
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from llmbench.engine.config import ModelConfig
from llmbench.engine.paged_attention import AttentionBatch, KVCache, paged_attention


@dataclass(frozen=True)
class Linear:
    """y = x @ W^T + bias (+ residual), with W kept in the layout that streams faster.

    `weight` is [out, in] as in the checkpoint, or its transpose [in, out] when
    `is_input_major`. Measured here (float32, 2 threads, one row, weights from DRAM), MKL reads
    a wide matrix faster input-major: [3072, 576] 20.7 vs 15.5 GB/s, [49152, 576] 22.0 vs 15.8;
    a tall one slower: [576, 1536] 13.9 vs 16.1. In 16 bits the native kernel wants [out, in].
    """

    weight: torch.Tensor
    bias: torch.Tensor | None = None
    is_input_major: bool = False

    @classmethod
    def build(cls, weight: torch.Tensor, bias: torch.Tensor | None = None) -> Linear:
        out_features, in_features = weight.shape
        if weight.device.type == "cpu" and weight.dtype == torch.float32:
            if out_features > in_features:
                return cls(weight.t().contiguous(), bias, is_input_major=True)
        return cls(weight, bias)

    @property
    def num_bytes(self) -> int:
        total = self.weight.numel() * self.weight.element_size()
        return total + (
            self.bias.numel() * self.bias.element_size() if self.bias is not None else 0
        )

    def __call__(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        w_t = self.weight if self.is_input_major else self.weight.t()  # [in, out]
        add = residual if residual is not None else self.bias
        if residual is not None and self.bias is not None:
            add = residual + self.bias
        return torch.mm(x, w_t) if add is None else torch.addmm(add, x, w_t)


@dataclass(frozen=True)
class _Layer:
    input_norm: torch.Tensor  # [h]
    qkv_proj: Linear  # h → nh*d + 2*nkv*d
    o_proj: Linear  # nh*d → h
    post_attention_norm: torch.Tensor  # [h]
    gate_up_proj: Linear  # h → 2*I
    down_proj: Linear  # I → h


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm: weight * x / sqrt(mean(x^2) + eps), statistics in float32 (one fused op)."""
    return F.rms_norm(x, weight.shape, weight, eps)


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
    """RoPE rotations e^(i·pos·freq) [positions, d/2] as complex64, grown on demand."""

    def __init__(self, config: ModelConfig, device: torch.device):
        self.inv_freq = rope_inv_freq(config).to(device)
        self.table = torch.empty(0, config.head_dim // 2, dtype=torch.complex64, device=device)

    def rotations(self, max_position: int) -> torch.Tensor:
        if max_position >= self.table.shape[0]:
            size = max(2 * self.table.shape[0], max_position + 1, 256)
            t = torch.arange(size, dtype=torch.float32, device=self.inv_freq.device)
            angles = torch.outer(t, self.inv_freq)  # [size, d/2]
            self.table = torch.polar(torch.ones_like(angles), angles)
        return self.table


def interleave_rope_rows(w: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Reorder each head's rows from HF's [x1 | x2] halves to pairs (x1[i], x2[i])."""
    head_dim = w.shape[0] // num_heads
    return w.view(num_heads, 2, head_dim // 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


def apply_rope_(x: torch.Tensor, rotations: torch.Tensor, head_dim: int) -> None:
    """Rotate x [T, heads * d] (interleaved pairs) in place; rotations: [T, 1, d/2] complex."""
    num_tokens = x.shape[0]
    pairs = x.view(num_tokens, -1, head_dim // 2, 2)
    if x.dtype == torch.float32:
        torch.view_as_complex(pairs).mul_(rotations)
    else:  # no complex bfloat16: rotate in float32, round once
        rotated = torch.view_as_real(torch.view_as_complex(pairs.float()) * rotations)
        x.copy_(rotated.view(num_tokens, -1))


class LlamaModel:
    """Forward pass of a Llama-family decoder over HF-named weights."""

    def __init__(self, config: ModelConfig, weights: dict[str, torch.Tensor]):
        self.config = config
        self.embed_tokens = weights["model.embed_tokens.weight"]  # [V, h]
        self.dtype = self.embed_tokens.dtype
        self.device = self.embed_tokens.device
        self.layers = [self._layer(weights, i) for i in range(config.num_layers)]
        self.norm = weights["model.norm.weight"]
        # A tied lm_head shares the embedding's storage unless Linear re-lays it out (float32
        # CPU: a transposed copy, +V*h*4 bytes, read 40% faster per decode step).
        self.lm_head = Linear.build(
            self.embed_tokens if config.tie_word_embeddings else weights["lm_head.weight"]
        )
        self.rotary = Rotary(config, self.device)
        self.scale = 1.0 / math.sqrt(config.head_dim)

    def _layer(self, w: dict[str, torch.Tensor], i: int) -> _Layer:
        cfg = self.config
        p = f"model.layers.{i}."
        attn = p + "self_attn."
        q, k, v = (w[f"{attn}{name}_proj.weight"] for name in "qkv")
        bias = None
        if cfg.qkv_bias:
            qb, kb, vb = (w[f"{attn}{name}_proj.bias"] for name in "qkv")
            qb, kb = (
                interleave_rope_rows(qb, cfg.num_heads),
                interleave_rope_rows(kb, cfg.num_kv_heads),
            )
            bias = torch.cat([qb, kb, vb])
        q, k = interleave_rope_rows(q, cfg.num_heads), interleave_rope_rows(k, cfg.num_kv_heads)
        gate_up = torch.cat([w[p + "mlp.gate_proj.weight"], w[p + "mlp.up_proj.weight"]])
        return _Layer(
            input_norm=w[p + "input_layernorm.weight"],
            qkv_proj=Linear.build(torch.cat([q, k, v]), bias),
            o_proj=Linear.build(w[attn + "o_proj.weight"]),
            post_attention_norm=w[p + "post_attention_layernorm.weight"],
            gate_up_proj=Linear.build(gate_up),
            down_proj=Linear.build(w[p + "mlp.down_proj.weight"]),
        )

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
        rotations = self.rotary.rotations(batch.max_position)[positions].unsqueeze(1)  # [T,1,d/2]
        qk_size = cfg.q_size + cfg.kv_size
        with _gemv_backend(self.device, self.dtype, num_tokens):
            x = F.embedding(input_ids, self.embed_tokens)  # [T, h]
            for i, layer in enumerate(self.layers):
                # Attention block.
                h = rms_norm(x, layer.input_norm, cfg.rms_norm_eps)
                qkv = layer.qkv_proj(h)  # [T, (nh + 2*nkv) * d]
                apply_rope_(qkv[:, :qk_size], rotations, cfg.head_dim)
                q = qkv[:, : cfg.q_size].view(num_tokens, cfg.num_heads, cfg.head_dim)
                kv = qkv[:, cfg.q_size :].view(num_tokens, 2, cfg.num_kv_heads, cfg.head_dim)
                attn = paged_attention(q, kv, kv_cache.layer(i), batch, self.scale)  # [T, nh, d]
                x = layer.o_proj(attn.view(num_tokens, cfg.q_size), residual=x)
                # MLP block (SwiGLU).
                h = rms_norm(x, layer.post_attention_norm, cfg.rms_norm_eps)
                gate_up = layer.gate_up_proj(h)  # [T, 2*I]
                act = (
                    F.silu(gate_up[:, : cfg.intermediate_size])
                    * gate_up[:, cfg.intermediate_size :]
                )
                x = layer.down_proj(act, residual=x)
        return x

    @torch.inference_mode()
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden: [N, h] rows that need a next token → logits [N, V] in float32."""
        with _gemv_backend(self.device, self.dtype, hidden.shape[0]):
            return self.lm_head(rms_norm(hidden, self.norm, self.config.rms_norm_eps)).float()


# Toggling oneDNN (below) makes torch warn about Intel-GPU TF32 on every call: not our concern.
warnings.filterwarnings("ignore", message="TF32 acceleration on top of oneDNN")


def _gemv_backend(device: torch.device, dtype: torch.dtype, num_rows: int):
    """Matrix-vector products in 16 bits on CPU: torch's native kernel, not oneDNN's.

    Measured here (SmolLM2 shapes, 2 threads, weights streamed from DRAM): bfloat16 x[1, 576] @
    W[3072, 576] reads 10.4 GB/s natively vs 6.5 GB/s through oneDNN; from 4 rows on oneDNN
    wins (6.6 vs 3.5 GB/s, and 181 vs 16 GFLOP/s at 32 rows).
    """
    if device.type == "cpu" and dtype != torch.float32 and num_rows <= 2:
        return torch.backends.mkldnn.flags(enabled=False)
    return contextlib.nullcontext()
