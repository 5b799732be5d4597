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
- every matrix multiply goes through a layer of `linear` (`Linear`, which keeps the weight in
  the layout MKL streams fastest and adds the residual inside the same `addmm` call, or, with
  `quantize`, a quantised layer of `quant.linear`: `linear.make_linear` picks).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import warnings
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from llmbench.engine import kernel_ops
from llmbench.engine.config import ModelConfig
from llmbench.engine.linear import Linear, make_linear
from llmbench.engine.moe import MoEMLP, Routing
from llmbench.engine.paged_attention import AttentionBatch, KVCache, paged_attention
from llmbench.engine.quant.linear import QUANT_GEMV_MAX_ROWS, ExtensionQuantLinear, QuantLinear
from llmbench.engine.quant.scheme import QuantScheme, lm_head_scheme
from llmbench.kernels.cpu_layer_ops import CpuLayerOps

# What a CPU model runs through the C++ extension when it is in use (matmuls: up to
# `cpu_gemv.max_rows` rows, quantised ones through `cpu_quant_gemv` where the build has it).
CPU_EXTENSION_OPS = (
    "matmuls",
    "rms_norm",
    "rope",
    "silu_and_mul",
    "paged_decode_attention",
    "decode_layer",
)


# The most rows a fused decode layer takes (decodes and verification rows: 64 sequences, or
# 12 verifying 4 drafts each); above its matmuls' own row limits they run torch's matmul
# inside the call, as the layers do outside it (`decode_layer.cpp`'s `linear`).
FUSED_MAX_ROWS = 64


def _fast_rows(matmul: Linear | QuantLinear) -> int | None:
    """Up to how many rows `matmul` runs the extension's own matmul (`gemv` on [out, in]
    weights, `quant_gemv` on int8 / int4 codes); None: it never does."""
    if isinstance(matmul, Linear) and matmul.fast_op is not None:
        return matmul.max_fast_rows
    if isinstance(matmul, ExtensionQuantLinear):
        return QUANT_GEMV_MAX_ROWS
    return None


def _fused_rows(layer: _Layer) -> int:
    """The most rows the fused decode layer takes for `layer`: FUSED_MAX_ROWS for a dense
    layer (no MoE, no q/k norm) whose four matmuls run the extension's (`_fast_rows`); else 0."""
    if layer.moe is not None or layer.q_norm is not None:
        return 0
    matmuls = (layer.qkv_proj, layer.o_proj, layer.gate_up_proj, layer.down_proj)
    return FUSED_MAX_ROWS if all(_fast_rows(m) is not None for m in matmuls) else 0


def _fused_weights(layer: _Layer) -> tuple[list[torch.Tensor], ...]:
    """The layer's four matmuls as `decode_layer` takes them: [W] for a float matmul,
    [codes, scales] for a quantised one (int4: float16 scale_zero; int8: float32 scale)."""

    def weights(matmul: Linear | ExtensionQuantLinear) -> list[torch.Tensor]:
        if isinstance(matmul, Linear):
            return [matmul.weight]
        scales = matmul.scale_zero if matmul.scale_zero is not None else matmul.scale
        return [matmul.codes, scales]

    return tuple(
        weights(m) for m in (layer.qkv_proj, layer.o_proj, layer.gate_up_proj, layer.down_proj)
    )


def _stacked_layers(
    layers: list[_Layer],
    fused_rows: list[int],
    fused_weights: list[tuple | None],
    fast_rows: list[int | None],
) -> tuple | None:
    """`decode_layers`' per-layer arguments (input norms, qkv weights, qkv biases, o weights,
    post-attention norms, gate_up weights, down weights: each weight list the layers' [W] or
    [codes, scales] one after another) when every layer is fused, with matmuls of one kind and
    one row limit; else None."""
    if not layers or any(rows != FUSED_MAX_ROWS for rows in fused_rows):
        return None
    if len({tuple(len(w) for w in weights) for weights in fused_weights}) != 1:
        return None
    if len(set(fast_rows)) != 1:
        return None
    matmuls = [[t for weights in fused_weights for t in weights[j]] for j in range(4)]
    return (
        [layer.input_norm for layer in layers],
        matmuls[0],
        [layer.qkv_proj.bias for layer in layers],
        matmuls[1],
        [layer.post_attention_norm for layer in layers],
        matmuls[2],
        matmuls[3],
    )


def held_tensors(part: object) -> Iterator[torch.Tensor]:
    """The tensors a model part holds: a tensor, or a dataclass / tuple / list of parts (a
    layer; a matmul: its weight, or codes, scales and zero points, and bias; an MoE block)."""
    if isinstance(part, torch.Tensor):
        yield part
    elif isinstance(part, (tuple, list)):
        for p in part:
            yield from held_tensors(p)
    elif dataclasses.is_dataclass(part) and not isinstance(part, type):
        for f in dataclasses.fields(part):
            yield from held_tensors(getattr(part, f.name))


def held_bytes(part: object) -> int:
    """Bytes of the tensors a model part holds (`held_tensors`; a matmul's are its
    `num_bytes`)."""
    return sum(t.numel() * t.element_size() for t in held_tensors(part))


@dataclass(frozen=True)
class _Layer:
    input_norm: torch.Tensor  # [h]
    qkv_proj: Linear | QuantLinear  # h → nh*d + 2*nkv*d
    o_proj: Linear | QuantLinear  # nh*d → h
    post_attention_norm: torch.Tensor  # [h]
    gate_up_proj: Linear | QuantLinear | None  # h → 2*I (None: the layer's MLP is `moe`)
    down_proj: Linear | QuantLinear | None  # I → h
    moe: MoEMLP | None = None  # router + experts, in place of the dense MLP
    q_norm: torch.Tensor | None = None  # [d], rows in the interleaved RoPE order (Qwen3)
    k_norm: torch.Tensor | None = None  # [d]


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


def _qk_norm_(
    qkv: torch.Tensor, q_norm: torch.Tensor, k_norm: torch.Tensor, cfg: ModelConfig
) -> None:
    """RMSNorm each q and k head of qkv [T, (nh + 2*nkv) * d] over its d dims, in place."""
    num_tokens, d = qkv.shape[0], cfg.head_dim
    q = qkv[:, : cfg.q_size].view(num_tokens, cfg.num_heads, d)
    k = qkv[:, cfg.q_size : cfg.q_size + cfg.kv_size].view(num_tokens, cfg.num_kv_heads, d)
    q.copy_(rms_norm(q, q_norm, cfg.rms_norm_eps))
    k.copy_(rms_norm(k, k_norm, cfg.rms_norm_eps))


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

    def __init__(
        self,
        config: ModelConfig,
        weights: dict[str, torch.Tensor],
        quantize: QuantScheme | None = None,
    ):
        self.config = config
        # Every layer matrix quantised at load to this scheme (None: kept in the model's dtype);
        # the embedding table and the norms always stay in the model's dtype.
        self.quantize = quantize
        self.embed_tokens = weights["model.embed_tokens.weight"]  # [V, h]
        self.dtype = self.embed_tokens.dtype
        self.device = self.embed_tokens.device
        self.layers = [self._layer(weights, i) for i in range(config.num_layers)]
        self.norm = weights["model.norm.weight"]
        # A tied lm_head shares the embedding's storage unless Linear re-lays it out (float32
        # CPU without the C++ extension: a transposed copy, +V*h*4 bytes, read 40% faster per
        # decode step) or it is quantised (a copy in its own scheme).
        self.lm_head = make_linear(
            self.embed_tokens if config.tie_word_embeddings else weights["lm_head.weight"],
            quantize=lm_head_scheme(quantize),
        )
        self.rotary = Rotary(config, self.device)
        self.scale = 1.0 / math.sqrt(config.head_dim)
        # The kernels layer's Triton ops (CUDA with Triton: `kernel_ops`), or None: torch ops.
        dispatch = kernel_ops.dispatch_for(self.device)
        # CPU without Triton: RMSNorm, RoPE and decode attention through the C++ extension
        # when it is in use (`kernels.cpu_layer_ops`), decode-sized matmuls too (`Linear`), and
        # bfloat16 prefill attention where it has AMX tiles or AVX-512 BF16 vectors
        # (`kernels.cpu_prefill_attention`).
        self.cpu_ops: CpuLayerOps | None = None
        if self.device.type == "cpu" and not dispatch.uses_triton:
            backend = kernel_ops.cpu_extension()
            ops = CPU_EXTENSION_OPS if backend.is_extension else ()
            if backend.is_extension:
                self.cpu_ops = CpuLayerOps.of(backend, config.head_dim)
                if self.cpu_ops.prefill_attention is not None and self.dtype == torch.bfloat16:
                    ops = (*ops, "prefill_attention")
            dispatch = dataclasses.replace(
                dispatch, cpu_extension=backend.describe(), cpu_extension_ops=ops
            )
        self.kernels = kernel_ops.TritonOps(dispatch) if dispatch.uses_triton else None
        # What runs the layers, in a few words for timing lines (`llmbench generate`).
        if dispatch.uses_triton:
            self.kernels_name = "Triton kernels"
        elif self.cpu_ops is not None:
            self.kernels_name = f"C++ extension ({backend.isa})"
        else:
            self.kernels_name = "torch ops"
        self.fuse_decode_layers = True  # off: every layer op by op, as the tests compare
        # Set by `llmbench profile`: an int64 [layers, 10] that `decode_layers` adds each layer's
        # op times (ns, on its own clock) into; None: no clock is read.
        self.layer_op_ns: torch.Tensor | None = None
        self.plan_fused_layers()
        self.kernels_description = kernel_ops.describe(dispatch)  # for the run's provenance
        # What each MoE layer routed in the latest forward, in layer order (empty when dense).
        self.last_routing: list[Routing] = []

    def plan_fused_layers(self) -> None:
        """What the C++ extension runs of a decode step, from `self.layers` (again after they
        change: a draft that keeps the first layers). Per layer: up to how many rows
        `CpuLayerOps.decode_layer` runs it (0: never), its matmuls as that call takes them, and
        up to how many rows they run the extension's; and, every layer fused alike (a dense
        model), their arguments for `decode_layers`, which runs the whole stack in one call
        (else None: one call a layer)."""
        self._fused_rows = [_fused_rows(layer) if self.cpu_ops else 0 for layer in self.layers]
        self._fused_weights = [
            _fused_weights(layer) if rows else None
            for layer, rows in zip(self.layers, self._fused_rows, strict=True)
        ]
        self._fast_rows = [_fast_rows(layer.qkv_proj) for layer in self.layers]
        self._stacked_layers = _stacked_layers(
            self.layers, self._fused_rows, self._fused_weights, self._fast_rows
        )

    @property
    def weight_bytes(self) -> dict[str, int]:
        """Bytes each part of the loaded model holds, as stored (quantised codes, scales and
        zero points included): `embedding` (the table; a step reads only its tokens' rows),
        `layers` (every decoder layer's matrices, biases and norms), `final_norm`, `lm_head`
        (a tied, unquantised lm_head is the embedding table itself). A step streams `layers`,
        `final_norm` and `lm_head` once."""
        return {
            "embedding": held_bytes(self.embed_tokens),
            "layers": sum(held_bytes(layer) for layer in self.layers),
            "final_norm": held_bytes(self.norm),
            "lm_head": held_bytes(self.lm_head),
        }

    def tensors(self) -> Iterator[torch.Tensor]:
        """Every tensor of the loaded model's weights: the embedding table, every layer's
        matrices (as stored: codes, scales, zero points), norms and biases, the lm_head."""
        return held_tensors((self.embed_tokens, self.layers, self.norm, self.lm_head))

    def _linear(
        self, weight: torch.Tensor, bias: torch.Tensor | None = None
    ) -> Linear | QuantLinear:
        return make_linear(weight, bias, self.quantize)

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
        # q/k norm weights scale head dims: they follow the rows' RoPE reordering.
        q_norm = k_norm = None
        if cfg.qk_norm:
            q_norm = interleave_rope_rows(w[attn + "q_norm.weight"], 1)
            k_norm = interleave_rope_rows(w[attn + "k_norm.weight"], 1)
        moe = gate_up_proj = down_proj = None
        if cfg.is_moe:
            moe = MoEMLP.build(cfg, w, p + "mlp.", self._linear)
        else:
            gate_up = torch.cat([w[p + "mlp.gate_proj.weight"], w[p + "mlp.up_proj.weight"]])
            gate_up_proj = self._linear(gate_up)
            down_proj = self._linear(w[p + "mlp.down_proj.weight"])
        return _Layer(
            input_norm=w[p + "input_layernorm.weight"],
            qkv_proj=self._linear(torch.cat([q, k, v]), bias),
            o_proj=self._linear(w[attn + "o_proj.weight"]),
            post_attention_norm=w[p + "post_attention_layernorm.weight"],
            gate_up_proj=gate_up_proj,
            down_proj=down_proj,
            moe=moe,
            q_norm=q_norm,
            k_norm=k_norm,
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
        table = self.rotary.rotations(batch.max_position)  # [P, d/2] complex
        # The Triton path (`self.kernels`) runs the same ops through the kernels layer.
        kern, cpu = self.kernels, self.cpu_ops
        step = kern.prepare(batch, kv_cache.block_size, table) if kern else None
        # cos, sin pairs [P, d/2, 2] for the C++ RoPE, else the rows' rotations [T, 1, d/2].
        cos_sin = torch.view_as_real(table) if cpu else None
        rotations = None if kern or cpu else table[positions].unsqueeze(1)
        norm = kern.rms_norm if kern else cpu.rms_norm if cpu else rms_norm
        decode_op = cpu.paged_decode_attention if cpu else None
        prefill_op = cpu.prefill_attention if cpu else None
        qk_size = cfg.q_size + cfg.kv_size
        self.last_routing = []
        # A step of one-token sequences on the C++ extension: each dense layer in one call
        # (csrc/decode_layer.cpp repeats the ops below in their order: change both together;
        # tests/engine/test_model_cpu_extension.py holds them bit-identical).
        is_fused = cpu and self.fuse_decode_layers
        fused = self._fused_decode_args(batch, kv_cache) if is_fused else None
        with self._gemv_backend(num_tokens):
            x = F.embedding(input_ids, self.embed_tokens)  # [T, h]
            stacked = self._stacked_layers
            if fused is not None and stacked is not None and num_tokens <= FUSED_MAX_ROWS:
                return cpu.decode_layers(
                    x,
                    *stacked,
                    cfg.intermediate_size,
                    cfg.rms_norm_eps,
                    positions,
                    cos_sin,
                    kv_cache.layers[: len(self.layers)],  # a draft's: the target's first
                    *fused,
                    self._fast_rows[0],
                    self.layer_op_ns,
                )
            for i, layer in enumerate(self.layers):
                if fused is not None and num_tokens <= self._fused_rows[i]:
                    qkv_w, o_w, gate_up_w, down_w = self._fused_weights[i]
                    x = cpu.decode_layer(
                        x,
                        layer.input_norm,
                        qkv_w,
                        layer.qkv_proj.bias,
                        o_w,
                        layer.post_attention_norm,
                        gate_up_w,
                        down_w,
                        cfg.intermediate_size,
                        cfg.rms_norm_eps,
                        positions,
                        cos_sin,
                        kv_cache.layer(i),
                        *fused,
                        self._fast_rows[i],  # the same for the layer's four matmuls
                    )
                    continue
                # Attention block.
                h = norm(x, layer.input_norm, cfg.rms_norm_eps)
                qkv = layer.qkv_proj(h)  # [T, (nh + 2*nkv) * d]
                if layer.q_norm is not None and layer.k_norm is not None:
                    _qk_norm_(qkv, layer.q_norm, layer.k_norm, cfg)
                if kern:
                    kern.rope_(qkv[:, :qk_size], positions, step, cfg.head_dim)
                elif cpu:
                    cpu.rope_(qkv[:, :qk_size], positions, cos_sin, cfg.head_dim)
                else:
                    apply_rope_(qkv[:, :qk_size], rotations, cfg.head_dim)
                q = qkv[:, : cfg.q_size].view(num_tokens, cfg.num_heads, cfg.head_dim)
                kv = qkv[:, cfg.q_size :].view(num_tokens, 2, cfg.num_kv_heads, cfg.head_dim)
                cache = kv_cache.layer(i)
                attn = (  # [T, nh, d]
                    kern.attention(q, kv, cache, batch, step, self.scale)
                    if kern
                    else paged_attention(q, kv, cache, batch, self.scale, decode_op, prefill_op)
                )
                x = layer.o_proj(attn.view(num_tokens, cfg.q_size), residual=x)
                # MLP block (SwiGLU, or a mixture of SwiGLU experts).
                h = norm(x, layer.post_attention_norm, cfg.rms_norm_eps)
                if layer.moe is not None:
                    x, routing = layer.moe(h, residual=x)
                    self.last_routing.append(routing)
                else:
                    gate_up = layer.gate_up_proj(h)  # [T, 2*I]
                    if kern:
                        act = kern.silu_and_mul(gate_up)
                    elif cpu:
                        act = cpu.silu_and_mul(gate_up)
                    else:
                        act = (
                            F.silu(gate_up[:, : cfg.intermediate_size])
                            * gate_up[:, cfg.intermediate_size :]
                        )
                    x = layer.down_proj(act, residual=x)
        return x

    def _fused_decode_args(self, batch: AttentionBatch, kv_cache: KVCache) -> tuple | None:
        """The step arguments of `CpuLayerOps.decode_layer` after the layer's own, when every
        row of the step is attended one at a time (decodes, verification rows) over a K/V
        cache in the model's dtype; else None."""
        d, cfg = batch.decodes, self.config
        if d is None or not d.is_whole_batch or kv_cache.kv is None:
            return None
        if kv_cache.kv.dtype != self.dtype:
            return None
        return (
            *(batch.slot_mapping, d.block_tables, d.context_lens, d.block_size, self.scale),
            *(d.max_context_len, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim),
        )

    @torch.inference_mode()
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden: [N, h] rows that need a next token → logits [N, V] in float32."""
        with self._gemv_backend(hidden.shape[0]):
            cpu = self.cpu_ops
            norm = self.kernels.rms_norm if self.kernels else cpu.rms_norm if cpu else rms_norm
            return self.lm_head(norm(hidden, self.norm, self.config.rms_norm_eps)).float()

    def _gemv_backend(self, num_rows: int):
        """Matrix-vector products in 16 bits on CPU without the C++ extension: torch's native
        kernel, not oneDNN's (with the extension its own matmul takes them, and the toggle,
        two calls a step, ~70 µs each under cProfile, would cost for nothing).

        Measured here (SmolLM2 shapes, 2 threads, weights streamed from DRAM): bfloat16 x[1, 576]
        @ W[3072, 576] reads 10.4 GB/s natively vs 6.5 GB/s through oneDNN; from 4 rows on oneDNN
        wins (6.6 vs 3.5 GB/s, and 181 vs 16 GFLOP/s at 32 rows).
        """
        is_native_gemv = self.device.type == "cpu" and self.dtype != torch.float32
        if is_native_gemv and self.cpu_ops is None:
            return torch_gemv_backend(num_rows)
        return contextlib.nullcontext()


def torch_gemv_backend(num_rows: int):
    """torch's own CPU matmul for `num_rows` rows of 16-bit x: its native kernel (oneDNN off)
    up to 2 rows, where it streams the weights faster (`LlamaModel._gemv_backend`), oneDNN
    above."""
    if num_rows <= 2:
        return torch.backends.mkldnn.flags(enabled=False)
    return contextlib.nullcontext()


# Toggling oneDNN (`LlamaModel._gemv_backend`) makes torch warn about Intel-GPU TF32 on every
# call: not our concern.
warnings.filterwarnings("ignore", message="TF32 acceleration on top of oneDNN")
