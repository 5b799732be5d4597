"""`GGUFSource`: a llama.cpp GGUF file as a WeightSource (config, tensors, tokenizer).

The file is memory-mapped: opening it parses the header (metadata and tensor table) and nothing
else, so `tensor_infos()` is cheap; `load()` dequantizes each tensor once through the `gguf`
package and hands back HF-named tensors. Two llama.cpp conventions are undone on the way:

- GGUF lists dimensions innermost first (`[in, out]`); PyTorch shapes are `[out, in]`.
- llama.cpp's converter reorders the rows of each Llama Q/K head for its interleaved RoPE
  (`_unpermute_rows` puts them back in HF order). Qwen2 uses NeoX RoPE and is stored unpermuted.

Mixtures of experts (Mixtral, stored as "llama" with an expert count; qwen2moe; qwen3moe) keep
each layer's experts stacked in one tensor per projection ([E, out, in]); they come back one
HF-named tensor per expert (`mlp.experts.{e}.gate_proj.weight`, ...).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import gguf
import numpy as np

from llmbench.engine.checkpoint import TensorInfo
from llmbench.engine.config import ModelConfig, RopeScaling
from llmbench.engine.tokenizer import Tokenizer
from llmbench.errors import UserError

if TYPE_CHECKING:  # torch is the engine extra: describing a model needs none
    import torch

# general.architecture -> (Q/K rows permuted by llama.cpp, q/k/v carry a bias).
# Mistral-7B-style models and Mixtral are stored as "llama" by llama.cpp.
_ARCHITECTURES = {
    "llama": (True, False),
    "qwen2": (False, True),
    "qwen2moe": (False, True),
    "qwen3moe": (False, False),
}
# Whether llama.cpp renormalises an architecture's top-k expert weights when the file does not
# say (`{arch}.expert_weights_norm`): Mixtral and Qwen3-MoE do, Qwen2-MoE does not.
_NORM_TOPK_DEFAULT = {"llama": True, "qwen2moe": False, "qwen3moe": True}
# `{arch}.expert_gating_func` values.
_GATING = {
    int(gguf.ExpertGatingFuncType.SOFTMAX): "softmax",
    int(gguf.ExpertGatingFuncType.SIGMOID): "sigmoid",
}

# Storage types `gguf.quants.dequantize` turns into float32 for us (numpy reference code). The
# package knows more (i-quants, ternary, MXFP4); they stay refused until a test covers them.
_DEQUANTIZABLE = frozenset(
    gguf.GGMLQuantizationType[name]
    for name in ("F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0")
    + ("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")
)

_ROPE_FREQS = "rope_freqs.weight"

# What the gguf package raises on a truncated or garbled file: short reads surface as reshape
# ValueErrors or IndexErrors on empty slices, unknown enum values as ValueError, duplicate keys
# as KeyError, a bad string as UnicodeDecodeError (a ValueError).
_CORRUPT_FILE_ERRORS = (ValueError, IndexError, KeyError, OSError, OverflowError, TypeError)


class _PlainArrayReader(gguf.GGUFReader):
    """GGUFReader over a plain ndarray view of the memmap.

    The reader slices its `data` array a few times per metadata item; slicing an `np.memmap`
    subclass costs ~10x a plain ndarray (`__array_finalize__`), which made opening SmolLM2's
    49k-token vocabulary take ~3.5 s instead of ~0.9 s. The view keeps the map alive and lazy.
    """

    @property
    def data(self) -> np.ndarray:
        return self._plain_data

    @data.setter
    def data(self, value: np.ndarray) -> None:
        self._plain_data = value.view(np.ndarray)


class GGUFSource:
    """A Llama, Qwen2, Mixtral or Qwen-MoE model in one GGUF file (common llama.cpp quants)."""

    def __init__(self, path: Path):
        self.path = path
        self._reader = _open_reader(path)
        arch = self._string("general.architecture")
        if arch not in _ARCHITECTURES:
            raise UserError(
                f"{path}: unsupported architecture {arch!r}: llmbench runs "
                f"{', '.join(sorted(_ARCHITECTURES))} GGUF files"
            )
        self._arch = arch
        self._is_qk_permuted, qkv_bias = _ARCHITECTURES[arch]
        self._tensors = {t.name: t for t in self._reader.tensors}
        self.config: ModelConfig = self._build_config(qkv_bias)
        self._plan = _tensor_plan(self.config)
        self._check_tensors()
        name = self._optional("general.name") or arch
        self.description = f"GGUF {path.name} ({name}, {self._file_type()})"

    # --- metadata ---------------------------------------------------------------------------

    def _optional(self, key: str) -> Any:
        field = self._reader.get_field(key)
        if field is None:
            return None
        try:
            return field.contents()
        except _CORRUPT_FILE_ERRORS as e:
            raise UserError(f"{self.path}: metadata '{key}' unreadable ({e}): {_REFETCH}") from None

    def _string(self, key: str) -> str:
        value = self._optional(key)
        if not isinstance(value, str):
            raise UserError(
                f"{self.path}: metadata '{key}' must be a string, got {value!r}: {_RECONVERT}"
            )
        return value

    def _int(self, key: str, default: int | None = None) -> int:
        value = self._optional(key)
        if value is None and default is not None:
            return default
        if not isinstance(value, int) or isinstance(value, bool):
            raise UserError(
                f"{self.path}: metadata '{key}' must be an integer, got {value!r}: {_RECONVERT}"
            )
        return value

    def _float(self, key: str, default: float) -> float:
        value = self._optional(key)
        if value is None:
            return default
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise UserError(
                f"{self.path}: metadata '{key}' must be a number, got {value!r}: {_RECONVERT}"
            )
        if self._reader.fields[key].types != [gguf.GGUFValueType.FLOAT32]:
            return float(value)
        # llama.cpp writes float32: 1e-5 comes back as 9.99999974e-06. The shortest decimal
        # that round-trips through float32 is the value the converter was given.
        return float(str(np.float32(value)))

    def _build_config(self, qkv_bias: bool) -> ModelConfig:
        a = self._arch
        hidden = self._int(f"{a}.embedding_length")
        num_heads = self._int(f"{a}.attention.head_count")
        head_dim = self._int(f"{a}.attention.key_length", default=0) or self._int(
            f"{a}.rope.dimension_count", default=hidden // max(num_heads, 1)
        )
        rotary_dim = self._int(f"{a}.rope.dimension_count", default=head_dim)
        if rotary_dim != head_dim:
            raise UserError(
                f"{self.path}: partial RoPE ({rotary_dim} of {head_dim} head dims) is not "
                f"supported: use a model that rotates the whole head"
            )
        tokens = self._reader.get_field("tokenizer.ggml.tokens")
        vocab_size = self._int(f"{a}.vocab_size", default=len(tokens.data) if tokens else 0)
        num_layers = self._int(f"{a}.block_count")
        num_kv_heads = self._int(f"{a}.attention.head_count_kv", default=num_heads)
        intermediate = self._int(f"{a}.feed_forward_length", default=0) or self._int(
            f"{a}.expert_feed_forward_length"
        )
        context = self._int(f"{a}.context_length")
        rope_theta = self._float(f"{a}.rope.freq_base", 10000.0)
        rope_scaling = self._rope_scaling(head_dim, rope_theta)
        rms_norm_eps = self._float(f"{a}.attention.layer_norm_rms_epsilon", 1e-5)
        try:
            return ModelConfig(
                vocab_size=vocab_size,
                hidden_size=hidden,
                num_layers=num_layers,
                num_heads=num_heads,
                num_kv_heads=num_kv_heads,
                head_dim=head_dim,
                intermediate_size=intermediate,
                max_position_embeddings=context,
                rope_theta=rope_theta,
                rope_scaling=rope_scaling,
                rms_norm_eps=rms_norm_eps,
                tie_word_embeddings="output.weight" not in self._tensors,
                qkv_bias=qkv_bias,
                **self._moe_fields(intermediate),
            )
        except UserError as e:  # ModelConfig's own checks, e.g. a head count of 0
            raise UserError(f"{self.path}: {e}: {_RECONVERT}") from None

    def _moe_fields(self, intermediate: int) -> dict:
        """Experts, top-k, widths and routing from the `{arch}.expert_*` metadata; q/k norm."""
        a = self._arch
        num_experts = self._int(f"{a}.expert_count", default=0)
        if not num_experts:
            return {"qk_norm": a == "qwen3moe"}
        gating = self._int(f"{a}.expert_gating_func", default=1)
        if gating not in _GATING:
            raise UserError(
                f"{self.path}: expert gating function {gating} is not supported (softmax, sigmoid)"
            )
        norm = self._optional(f"{a}.expert_weights_norm")
        return dict(
            num_experts=num_experts,
            num_experts_per_tok=self._int(f"{a}.expert_used_count"),
            # Mixtral's converter writes the experts' width as feed_forward_length.
            moe_intermediate_size=self._int(
                f"{a}.expert_feed_forward_length", default=intermediate
            ),
            shared_expert_intermediate_size=self._int(
                f"{a}.expert_shared_feed_forward_length", default=0
            ),
            router_scoring=_GATING[gating],
            norm_topk_prob=_NORM_TOPK_DEFAULT.get(a, True) if norm is None else bool(norm),
            qk_norm=a == "qwen3moe",
        )

    def _rope_scaling(self, head_dim: int, rope_theta: float) -> RopeScaling | None:
        """Llama-3 RoPE scaling, which llama.cpp stores as per-frequency factors.

        The converter writes the factors as a `rope_freqs` tensor and (in most versions) none of
        the parameters, so they take Llama 3's values unless the metadata says otherwise; the
        factor itself defaults to the tensor's largest entry, which is exactly `factor` (the
        lowest frequencies get divided by it): 8 for Llama 3.1, 32 for Llama 3.2. The factors
        the parameters imply must then match the tensor, or the model would run with RoPE
        different from llama.cpp's.
        """
        a = self._arch
        scaling_type = self._optional(f"{a}.rope.scaling.type")
        if scaling_type not in (None, "none"):
            raise UserError(
                f"{self.path}: RoPE scaling type {scaling_type!r} is not supported: "
                f"llmbench runs default and Llama-3 RoPE"
            )
        if _ROPE_FREQS not in self._tensors:
            return None
        stored = self._dequantize(self._tensors[_ROPE_FREQS]).astype(np.float64)
        scaling = RopeScaling(
            factor=self._float(f"{a}.rope.scaling.factor", float(stored.max())),
            low_freq_factor=1.0,
            high_freq_factor=4.0,
            original_max_position_embeddings=self._int(
                f"{a}.rope.scaling.original_context_length", default=8192
            ),
        )
        implied = _llama3_rope_factors(scaling, head_dim, rope_theta)
        if implied.shape != stored.shape or not np.allclose(implied, stored, rtol=1e-5):
            raise UserError(
                f"{self.path}: the rope_freqs tensor does not match Llama-3 RoPE scaling "
                f"({scaling}): this RoPE variant is not supported"
            )
        return scaling

    def _file_type(self) -> str:
        """'Q4_1' for a file llama.cpp called MOSTLY_Q4_1; else the type holding the most bytes."""
        try:
            name = gguf.LlamaFileType(self._optional("general.file_type")).name
        except ValueError:
            name = "GUESSED"
        if name != "GUESSED":
            return name.removeprefix("MOSTLY_").removeprefix("ALL_")
        by_type: dict[str, int] = {}
        for t in self._reader.tensors:
            by_type[t.tensor_type.name] = by_type.get(t.tensor_type.name, 0) + t.n_bytes
        return max(by_type, key=by_type.__getitem__, default="empty")

    # --- tensors ----------------------------------------------------------------------------

    def _check_tensors(self) -> None:
        """Every expected tensor present with its shape, and nothing else (e.g. MoE experts)."""
        for name, tensor in self._tensors.items():
            if name == _ROPE_FREQS:
                continue
            if name not in self._plan:
                raise UserError(
                    f"{self.path}: unexpected tensor '{name}': the metadata describes no such "
                    f"part of a {self._arch} model: {_RECONVERT}"
                )
            shape = _torch_shape(tensor)
            expected = self._plan[name][1]
            if _squeeze(shape) != _squeeze(expected):  # [1, h] and [h] hold the same
                raise UserError(
                    f"{self.path}: tensor '{name}' has shape {list(shape)}, the metadata implies "
                    f"{list(expected)}: {_RECONVERT}"
                )
        missing = [name for name in self._plan if name not in self._tensors]
        if missing:
            raise UserError(
                f"{self.path}: missing tensor(s) {', '.join(missing[:3])}"
                f"{' ...' if len(missing) > 3 else ''}: {_RECONVERT}"
            )

    def tensor_infos(self) -> list[TensorInfo]:
        """Every tensor as stored: GGUF name, [out, in] shape, GGML type name, bytes on disk."""
        return [
            TensorInfo(t.name, _torch_shape(t), t.tensor_type.name, int(t.n_bytes))
            for t in self._reader.tensors
        ]

    def load(self, dtype: torch.dtype, device: torch.device) -> dict[str, torch.Tensor]:
        """Every weight dequantized once, HF-named, [out, in], in `dtype` on `device`."""
        import torch

        for t in self._reader.tensors:  # refuse before spending time on the others
            if t.tensor_type not in _DEQUANTIZABLE:
                supported = ", ".join(sorted(q.name for q in _DEQUANTIZABLE))
                raise UserError(
                    f"{self.path}: tensor '{t.name}' is stored as {t.tensor_type.name}, which "
                    f"llmbench cannot dequantize: use a file quantized as one of {supported}"
                )
        cfg = self.config
        weights = {}
        for gguf_name, (hf_name, shape) in self._plan.items():
            tensor = self._tensors[gguf_name]
            x = torch.from_numpy(self._dequantize(tensor)).reshape(shape)
            if self._is_qk_permuted and ".attn_q." in gguf_name:
                x = _unpermute_rows(x, cfg.num_heads)
            elif self._is_qk_permuted and ".attn_k." in gguf_name:
                x = _unpermute_rows(x, cfg.num_kv_heads)
            if "{e}" in hf_name:  # stacked experts [E, out, in]: one tensor per expert
                x = x.to(device=device, dtype=dtype)
                for e in range(x.shape[0]):
                    weights[hf_name.format(e=e)] = x[e]
            else:
                weights[hf_name] = x.to(device=device, dtype=dtype)
        return weights

    def _dequantize(self, tensor: gguf.ReaderTensor) -> np.ndarray:
        """float32 values of one tensor, in a fresh writable array (the map is read-only)."""
        try:
            values = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
        except _CORRUPT_FILE_ERRORS as e:
            raise UserError(
                f"{self.path}: tensor '{tensor.name}' unreadable ({e}): {_REFETCH}"
            ) from None
        if not values.flags.writeable or values.dtype != np.float32:
            values = values.astype(np.float32)  # F32 is a view of the map: copy it
        return values

    def tokenizer(self) -> Tokenizer:
        return Tokenizer.from_gguf(self._reader)


_REFETCH = "the file may be truncated or corrupt; download it again"
_RECONVERT = "the file is not a complete llama.cpp GGUF; convert the model again"


def _open_reader(path: Path) -> gguf.GGUFReader:
    if not path.exists():
        raise UserError(f"{path}: no such file: check the path or pull the model again")
    if not path.is_file():
        raise UserError(f"{path}: not a file: give the .gguf file itself")
    try:
        with path.open("rb") as f:
            magic = f.read(4)
    except OSError as e:
        raise UserError(
            f"{path}: cannot read ({e.strerror}): check the file's permissions"
        ) from None
    if magic != b"GGUF":
        raise UserError(
            f"{path}: not a GGUF file (starts with {magic!r}, not b'GGUF'): give a llama.cpp "
            f".gguf file or an HF model folder"
        )
    try:
        return _PlainArrayReader(path)
    except _CORRUPT_FILE_ERRORS as e:
        raise UserError(f"{path}: unreadable GGUF ({e}): {_REFETCH}") from None


def _torch_shape(tensor: gguf.ReaderTensor) -> tuple[int, ...]:
    """GGUF lists dimensions innermost first; PyTorch outermost first."""
    return tuple(int(d) for d in reversed(tensor.shape.tolist()))


def _tensor_plan(config: ModelConfig) -> dict[str, tuple[str, tuple[int, ...]]]:
    """GGUF name -> (HF name, PyTorch shape) of every tensor a model with `config` needs."""
    h, i, v = config.hidden_size, config.intermediate_size, config.vocab_size
    q, kv = config.q_size, config.kv_size
    plan = {
        "token_embd.weight": ("model.embed_tokens.weight", (v, h)),
        "output_norm.weight": ("model.norm.weight", (h,)),
    }
    if not config.tie_word_embeddings:
        plan["output.weight"] = ("lm_head.weight", (v, h))
    layer = {
        "attn_norm.weight": ("input_layernorm.weight", (h,)),
        "attn_q.weight": ("self_attn.q_proj.weight", (q, h)),
        "attn_k.weight": ("self_attn.k_proj.weight", (kv, h)),
        "attn_v.weight": ("self_attn.v_proj.weight", (kv, h)),
        "attn_output.weight": ("self_attn.o_proj.weight", (h, q)),
        "ffn_norm.weight": ("post_attention_layernorm.weight", (h,)),
    }
    if config.is_moe:
        layer.update(_moe_tensor_plan(config))
    else:
        layer["ffn_gate.weight"] = ("mlp.gate_proj.weight", (i, h))
        layer["ffn_up.weight"] = ("mlp.up_proj.weight", (i, h))
        layer["ffn_down.weight"] = ("mlp.down_proj.weight", (h, i))
    if config.qk_norm:
        layer["attn_q_norm.weight"] = ("self_attn.q_norm.weight", (config.head_dim,))
        layer["attn_k_norm.weight"] = ("self_attn.k_norm.weight", (config.head_dim,))
    if config.qkv_bias:
        layer["attn_q.bias"] = ("self_attn.q_proj.bias", (q,))
        layer["attn_k.bias"] = ("self_attn.k_proj.bias", (kv,))
        layer["attn_v.bias"] = ("self_attn.v_proj.bias", (kv,))
    for n in range(config.num_layers):
        for gguf_name, (hf_name, shape) in layer.items():
            plan[f"blk.{n}.{gguf_name}"] = (f"model.layers.{n}.{hf_name}", shape)
    return plan


def _moe_tensor_plan(config: ModelConfig) -> dict[str, tuple[str, tuple[int, ...]]]:
    """One MoE layer's GGUF tensors; `{e}` in an HF name marks a stack of E experts."""
    h, moe_i, num_experts = config.hidden_size, config.moe_intermediate_size, config.num_experts
    plan = {
        "ffn_gate_inp.weight": ("mlp.gate.weight", (num_experts, h)),
        "ffn_gate_exps.weight": ("mlp.experts.{e}.gate_proj.weight", (num_experts, moe_i, h)),
        "ffn_up_exps.weight": ("mlp.experts.{e}.up_proj.weight", (num_experts, moe_i, h)),
        "ffn_down_exps.weight": ("mlp.experts.{e}.down_proj.weight", (num_experts, h, moe_i)),
    }
    shared_i = config.shared_expert_intermediate_size
    if shared_i:
        plan["ffn_gate_inp_shexp.weight"] = ("mlp.shared_expert_gate.weight", (1, h))
        plan["ffn_gate_shexp.weight"] = ("mlp.shared_expert.gate_proj.weight", (shared_i, h))
        plan["ffn_up_shexp.weight"] = ("mlp.shared_expert.up_proj.weight", (shared_i, h))
        plan["ffn_down_shexp.weight"] = ("mlp.shared_expert.down_proj.weight", (h, shared_i))
    return plan


def _squeeze(shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(d for d in shape if d != 1)


def _unpermute_rows(w: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Undo llama.cpp's Q/K row order: per head, HF rows (0..D/2-1 | D/2..D-1) -> pairs.

    HF's RoPE rotates dim j with dim j + D/2; llama.cpp's rotates adjacent dims 2j, 2j+1, so its
    converter stores head row j at 2j and row j + D/2 at 2j+1. Reading the stored rows as
    [head, D/2, 2] and swapping the last two axes gives [head, 2, D/2], i.e. HF order.
    """
    # w: [num_heads * D, in] (or [num_heads * D] for a bias)
    rest = w.shape[1:]
    return w.reshape(num_heads, -1, 2, *rest).transpose(1, 2).reshape(w.shape)


def _llama3_rope_factors(scaling: RopeScaling, head_dim: int, rope_theta: float) -> np.ndarray:
    """Divisor of each RoPE frequency under Llama-3 scaling, as llama.cpp's converter stores it.

    Wavelengths shorter than original_context / high_freq_factor keep their frequency (1),
    longer than original_context / low_freq_factor are slowed by `factor`, and the band between
    blends the two smoothly.
    """
    inv_freq = rope_theta ** -(np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    wavelen = 2 * math.pi / inv_freq  # [head_dim / 2]
    context = scaling.original_max_position_embeddings
    smooth = (context / wavelen - scaling.low_freq_factor) / (
        scaling.high_freq_factor - scaling.low_freq_factor
    )
    blended = 1 / ((1 - smooth) / scaling.factor + smooth)
    return np.where(
        wavelen < context / scaling.high_freq_factor,
        1.0,
        np.where(wavelen > context / scaling.low_freq_factor, scaling.factor, blended),
    )
