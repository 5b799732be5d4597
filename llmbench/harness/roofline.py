"""Roofline cost model: FLOPs and bytes of one engine step, napkin maths in code.

Torch-free. The model shape comes from `ModelConfig` (imported for type hints only, so this module
loads without the engine); the hardware peaks are plain data in `HARDWARE`.

What is counted (DESIGN.md "Measurement rules"):

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

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # type hints only: `llmbench report` must run without the engine
    from llmbench.engine.config import ModelConfig

# The largest decode batch `ridge_batch` looks at.
MAX_RIDGE_BATCH = 65_536

# Bytes per weight or KV element of each storage format (int4: two per byte, scales ignored).
BYTES_PER_ELEM = {
    "float32": 4.0,
    "bfloat16": 2.0,
    "float16": 2.0,
    "fp8": 1.0,
    "int8": 1.0,
    "int4": 0.5,
}


@dataclass(frozen=True)
class StepShape:
    """What one engine step computes, per device.

    `prefill`: per prefill sequence (start_position, num_new_tokens) — a chunk of a prompt that
    starts at `start_position` (0 for a fresh prompt, > 0 for a later chunk or a prefix hit).
    `decode_context_lens`: per decode sequence, its context length *including* the new token.
    `weight_bytes_per_param`: 4 fp32, 2 bf16, 1 int8, 0.5625 for a Q4_1-like format (4.5 bits).
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


# Datasheet peaks, dense (no 2:4 sparsity). `float32` is the non-tensor-core (vector) rate;
# `bfloat16`/`float16` the dense tensor-core rate; `int8` dense tensor-core ops/s. Bandwidth and
# memory in decimal units as marketed (GB = 1e9). None where we are not sure of the number.
_TB = 1e12
_T = 1e12
_GB = 1e9

HARDWARE: dict[str, dict] = {
    # NVIDIA A100 datasheet (SXM4): 1,555 GB/s HBM2; FP32 19.5 TF, BF16/FP16 312 TF, INT8 624 TOPS.
    "A100-40GB": {
        "memory_bandwidth_bytes_per_s": 1.555 * _TB,
        "flops_per_s": {
            "float32": 19.5 * _T,
            "bfloat16": 312 * _T,
            "float16": 312 * _T,
            "int8": 624 * _T,
        },
        "memory_bytes": 40 * _GB,
        "interconnect": "NVLink 3, 600 GB/s",
    },
    # NVIDIA A100 datasheet (80GB SXM4): 2,039 GB/s HBM2e; same compute as the 40GB.
    "A100-80GB": {
        "memory_bandwidth_bytes_per_s": 2.039 * _TB,
        "flops_per_s": {
            "float32": 19.5 * _T,
            "bfloat16": 312 * _T,
            "float16": 312 * _T,
            "int8": 624 * _T,
        },
        "memory_bytes": 80 * _GB,
        "interconnect": "NVLink 3, 600 GB/s",
    },
    # NVIDIA H100 datasheet (SXM5): 3.35 TB/s; FP32 67 TF, BF16/FP16 989 TF, INT8 1,979 TOPS.
    "H100-SXM": {
        "memory_bandwidth_bytes_per_s": 3.35 * _TB,
        "flops_per_s": {
            "float32": 67 * _T,
            "bfloat16": 989 * _T,
            "float16": 989 * _T,
            "int8": 1979 * _T,
        },
        "memory_bytes": 80 * _GB,
        "interconnect": "NVLink 4, 900 GB/s",
    },
    # NVIDIA H100 datasheet (PCIe): 2.0 TB/s; FP32 51 TF, BF16/FP16 756 TF, INT8 1,513 TOPS.
    "H100-PCIe": {
        "memory_bandwidth_bytes_per_s": 2.0 * _TB,
        "flops_per_s": {
            "float32": 51 * _T,
            "bfloat16": 756 * _T,
            "float16": 756 * _T,
            "int8": 1513 * _T,
        },
        "memory_bytes": 80 * _GB,
        "interconnect": "PCIe Gen5, 128 GB/s (NVLink bridge 600 GB/s)",
    },
    # NVIDIA H200 datasheet (SXM): 4.8 TB/s HBM3e, 141 GB; compute as H100 SXM.
    "H200": {
        "memory_bandwidth_bytes_per_s": 4.8 * _TB,
        "flops_per_s": {
            "float32": 67 * _T,
            "bfloat16": 989 * _T,
            "float16": 989 * _T,
            "int8": 1979 * _T,
        },
        "memory_bytes": 141 * _GB,
        "interconnect": "NVLink 4, 900 GB/s",
    },
    # NVIDIA HGX B200 datasheet, per GPU: 8 TB/s HBM3e; BF16/FP16 2.25 PF, INT8 4.5 POPS dense.
    # FP32 vector rate not stated there; 192 GB per the product brief (180 GB usable in DGX B200).
    "B200": {
        "memory_bandwidth_bytes_per_s": 8.0 * _TB,
        "flops_per_s": {
            "float32": None,
            "bfloat16": 2250 * _T,
            "float16": 2250 * _T,
            "int8": 4500 * _T,
        },
        "memory_bytes": 192 * _GB,
        "interconnect": "NVLink 5, 1.8 TB/s",
    },
    # NVIDIA L4 datasheet: 300 GB/s GDDR6, 24 GB; FP32 30.3 TF, BF16/FP16 121 TF, INT8 242.5 TOPS.
    "L4": {
        "memory_bandwidth_bytes_per_s": 0.3 * _TB,
        "flops_per_s": {
            "float32": 30.3 * _T,
            "bfloat16": 121 * _T,
            "float16": 121 * _T,
            "int8": 242.5 * _T,
        },
        "memory_bytes": 24 * _GB,
        "interconnect": "PCIe Gen4 x16, 64 GB/s",
    },
    # NVIDIA L40S datasheet: 864 GB/s GDDR6, 48 GB; FP32 91.6 TF, BF16/FP16 362 TF, INT8 733 TOPS.
    "L40S": {
        "memory_bandwidth_bytes_per_s": 0.864 * _TB,
        "flops_per_s": {
            "float32": 91.6 * _T,
            "bfloat16": 362.05 * _T,
            "float16": 362.05 * _T,
            "int8": 733 * _T,
        },
        "memory_bytes": 48 * _GB,
        "interconnect": "PCIe Gen4 x16, 64 GB/s",
    },
    # NVIDIA Ada whitepaper (RTX 4090): 1,008 GB/s GDDR6X, 24 GB; FP32 82.6 TF; BF16/FP16 tensor
    # with FP32 accumulate 165.2 TF (what frameworks use; 330 with FP16 accumulate); INT8 660.6.
    "RTX-4090": {
        "memory_bandwidth_bytes_per_s": 1.008 * _TB,
        "flops_per_s": {
            "float32": 82.6 * _T,
            "bfloat16": 165.2 * _T,
            "float16": 165.2 * _T,
            "int8": 660.6 * _T,
        },
        "memory_bytes": 24 * _GB,
        "interconnect": "PCIe Gen4 x16, 64 GB/s (no NVLink)",
    },
    # AMD Instinct MI300X datasheet: 5.3 TB/s HBM3, 192 GB; FP32 vector 81.7 TF, BF16/FP16
    # 1,307.4 TF, INT8 2,614.9 TOPS dense.
    "MI300X": {
        "memory_bandwidth_bytes_per_s": 5.3 * _TB,
        "flops_per_s": {
            "float32": 81.7 * _T,
            "bfloat16": 1307.4 * _T,
            "float16": 1307.4 * _T,
            "int8": 2614.9 * _T,
        },
        "memory_bytes": 192 * _GB,
        "interconnect": "Infinity Fabric, 896 GB/s",
    },
}


_ALIASES = {"h100": "h100-sxm", "a100": "a100-80gb", "4090": "rtx-4090"}


def datasheet(name: str) -> dict[str, Any] | None:
    """The `HARDWARE` entry for a name in any case, or a short alias (h100, a100, 4090)."""
    by_lower = {key.lower(): value for key, value in HARDWARE.items()}
    return by_lower.get(_ALIASES.get(name.lower(), name.lower()))


# What `torch.cuda.get_device_name()` says → HARDWARE key; the first match wins, so the
# more specific patterns come first. All words of a pattern must be in the name.
_DEVICE_NAMES = (
    ("h100 pcie", "H100-PCIe"),
    ("h100", "H100-SXM"),
    ("h200", "H200"),
    ("b200", "B200"),
    ("a100 40gb", "A100-40GB"),
    ("a100", "A100-80GB"),
    ("l40s", "L40S"),
    ("l4", "L4"),
    ("4090", "RTX-4090"),
    ("mi300x", "MI300X"),
)


def datasheet_name_of(device_name: str) -> str | None:
    """The datasheet entry of a device as the driver names it ("NVIDIA H100 80GB HBM3" →
    "H100-SXM"), or None (CPUs, unknown GPUs)."""
    words = device_name.lower().replace("-", " ").split()
    for pattern, key in _DEVICE_NAMES:
        if all(part in words for part in pattern.split()):
            return key
    return None


# --- achieved numbers of a run --------------------------------------------------------------


def step_phase(num_prefill_tokens: int, num_decode_seqs: int) -> str:
    """`decode` (no prompt token in the step), `prefill` (no decode), or `mixed`."""
    if num_prefill_tokens == 0:
        return "decode"
    return "prefill" if num_decode_seqs == 0 else "mixed"


def cost_steps(
    config: ModelConfig,
    steps: Sequence[Any],
    weight_bytes_per_param: float,
    kv_bytes_per_elem: float,
) -> list[dict[str, Any]]:
    """Every engine step as a roofline point: the record's fields plus `phase`, `num_seqs`,
    `flops` and `bytes` (what `step_cost` says the step computed and moved).

    Each step is anything with `t_start_ns`, `t_end_ns`, `context_lens`, `query_lens`,
    `num_prefill_tokens`, `num_decode_seqs` (a `StepRecord`): a sequence that ran q tokens
    ending at context c is a chunk starting at c - q.
    """
    points = []
    for step in steps:
        shape = StepShape(
            prefill=tuple(
                (c - q, q) for c, q in zip(step.context_lens, step.query_lens, strict=True)
            ),
            weight_bytes_per_param=weight_bytes_per_param,
            kv_bytes_per_elem=kv_bytes_per_elem,
        )
        cost = step_cost(config, shape)
        fields = dataclasses.asdict(step) if dataclasses.is_dataclass(step) else vars(step)
        points.append(
            {
                **fields,
                "phase": step_phase(step.num_prefill_tokens, step.num_decode_seqs),
                "num_seqs": len(step.context_lens),
                "flops": cost.flops,
                "bytes": cost.bytes,
            }
        )
    return points


def estimate_decode_steps(
    config: ModelConfig,
    records: Sequence[Any],
    weight_bytes_per_param: float,
    kv_bytes_per_elem: float,
    num_windows: int = 100,
) -> list[dict[str, Any]]:
    """Decode roofline points of a server seen only from the client, one per time window.

    A server's decode step gives every running stream one token, so within a window:
    batch B = streams in their decode phase (time-averaged), steps = decode tokens / B, and
    each step costs `decode_cost(B, mean context)`. Streams are the successful requests'
    token arrivals (`chunk_ns`, `chunk_tokens`, `num_prompt_tokens`; the first chunk is the
    prefill's). What the server does besides decoding (prefills, stalls) counts as decode
    time here, so the numbers are lower bounds — and always labelled `is_estimated`. A window
    spans at least 10 median inter-token gaps: a token is credited to the window it lands in,
    so a window of about one gap would get a whole step or none.
    Formula: bytes/s of a window = (decode tokens / B) · decode_cost(B, ctx).bytes / window.
    """
    streams = [r for r in records if r.ok and len(r.chunk_ns) > 1]
    if not streams:
        return []
    t0 = min(r.chunk_ns[0] for r in streams)
    t1 = max(r.chunk_ns[-1] for r in streams)
    gaps = sorted(b - a for r in streams for a, b in pairwise(r.chunk_ns))
    width = max((t1 - t0) / num_windows, 10 * gaps[len(gaps) // 2], 1)
    num_windows = max(1, min(num_windows, math.ceil((t1 - t0) / width)))
    windows = [{"stream_ns": 0.0, "tokens": 0, "context_tokens": 0.0} for _ in range(num_windows)]

    def window_of(t_ns: int) -> int:
        return min(int((t_ns - t0) / width), num_windows - 1)

    for r in streams:
        start, end = r.chunk_ns[0], r.chunk_ns[-1]
        for k in range(window_of(start), window_of(end) + 1):  # time-weighted batch
            lo, hi = t0 + k * width, t0 + (k + 1) * width
            windows[k]["stream_ns"] += max(0.0, min(hi, end) - max(lo, start))
        context = r.num_prompt_tokens + r.chunk_tokens[0]
        for t_ns, num_tokens in zip(r.chunk_ns[1:], r.chunk_tokens[1:], strict=True):
            w = windows[window_of(t_ns)]
            w["tokens"] += num_tokens
            # With c tokens known, the k steps behind a chunk of k ran at contexts c .. c+k-1
            # (a decode step's context includes the token it runs).
            w["context_tokens"] += num_tokens * context + num_tokens * (num_tokens - 1) / 2
            context += num_tokens
    points = []
    for k, w in enumerate(windows):
        if w["stream_ns"] == 0:  # nothing decoding: not decode time
            continue
        batch = w["stream_ns"] / width
        num_steps = w["tokens"] / batch  # 0 in a window where streams waited: time, no bytes
        context = max(1, round(w["context_tokens"] / w["tokens"])) if w["tokens"] else 1
        cost = decode_cost(
            config, max(1, round(batch)), context, weight_bytes_per_param, kv_bytes_per_elem
        )
        points.append(
            {
                "t_start_ns": round(t0 + k * width),
                "t_end_ns": round(t0 + (k + 1) * width),
                "phase": "decode",
                "num_seqs": round(batch, 2),
                "num_steps": num_steps,
                "mean_context_len": context,
                "flops": num_steps * cost.flops,
                "bytes": num_steps * cost.bytes,
                "is_estimated": True,
            }
        )
    return points


def phase_utilization(
    points: Sequence[dict[str, Any]],
    peak_read_bytes_per_s: float | None,
    peak_flops_per_s: float | None,
) -> dict[str, dict[str, float | None]]:
    """Achieved bandwidth and FLOP/s per phase of roofline points (`cost_steps`,
    `estimate_decode_steps`), against peak roofs (MBU/MFU None where the roofs are unknown).

    Formula: MBU = Σ bytes / Σ seconds / peak read bandwidth;
             MFU = Σ FLOPs / Σ seconds / peak FLOP/s (sums over the phase's points).
    """
    totals: dict[str, list[float]] = {}
    for point in points:
        acc = totals.setdefault(point["phase"], [0, 0.0, 0.0, 0.0])
        acc[0] += point.get("num_steps", 1)  # an estimated point stands for several steps
        acc[1] += (point["t_end_ns"] - point["t_start_ns"]) / 1e9
        acc[2] += point["bytes"]
        acc[3] += point["flops"]
    out = {}
    for phase, (num_steps, seconds, num_bytes, flops) in totals.items():
        if seconds <= 0:
            continue
        out[phase] = {
            "num_steps": num_steps,
            "seconds": seconds,
            "bytes_per_s": num_bytes / seconds,
            "flops_per_s": flops / seconds,
            "mbu": num_bytes / seconds / peak_read_bytes_per_s if peak_read_bytes_per_s else None,
            "mfu": flops / seconds / peak_flops_per_s if peak_flops_per_s else None,
            "arithmetic_intensity": flops / num_bytes if num_bytes else None,
        }
    return out
