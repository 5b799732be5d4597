"""The model's ops through the kernels layer's Triton kernels, when the dispatch says "triton".

The engine's two choices of implementation are made here, each a UserError when its
environment variable is bad: `dispatch_for` (Triton kernels or torch ops, LLMBENCH_KERNELS) and,
on a CPU, `cpu_extension` (the C++ library behind `linear.Linear`'s decode matmuls, the
quantised layers' int8/int4 matmul and the model's per-layer ops, LLMBENCH_CPU_EXTENSION).

`LlamaModel` holds a `TritonOps` (CUDA with Triton, or `LLMBENCH_KERNELS=triton` under the
interpreter) or None (the torch path). Once per forward, `prepare` turns the step's chunks into
the kernels' index tensors; then each layer calls `rms_norm`, `rope_`, `attention` and
`silu_and_mul` here instead of the torch ops. Attention over a cache not held in the model's
dtype (int8/int4, another float) stays on the torch path (`paged_attention`).

A decode step replayed from a CUDA graph (`cuda_graphs`) must read the same index tensors every
time: it passes a `PreparedBatch`, whose `StepIndex` lives in static buffers, and `prepare`
hands that index back instead of building one.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from llmbench.engine.host_to_device import to_device
from llmbench.engine.paged_attention import AttentionBatch, SplitLayer, paged_attention
from llmbench.errors import UserError
from llmbench.kernels import cpu_extension as cpu_ext
from llmbench.kernels import dispatch as kernel_dispatch
from llmbench.kernels.errors import KernelDispatchError

# The ops the model's forward pass runs through the kernels layer.
ENGINE_OPS = (
    "rms_norm",
    "rope",
    "silu_and_mul",
    "kv_cache_write",
    "paged_decode_attention",
    "chunked_prefill_attention",
)


def dispatch_for(device: torch.device) -> kernel_dispatch.Dispatch:
    """The kernels layer's choice for `device`; a bad LLMBENCH_KERNELS is a UserError."""
    try:
        return kernel_dispatch.choose(device.type)
    except KernelDispatchError as e:
        raise UserError(str(e)) from None


def cpu_extension() -> cpu_ext.CpuExtension:
    """The process's CPU C++ extension (`kernels.cpu_extension.default()`: loaded, built first
    if need be, or torch's ops with the reason); a bad LLMBENCH_CPU_EXTENSION is a UserError."""
    try:
        return cpu_ext.default()
    except KernelDispatchError as e:
        raise UserError(str(e)) from None


def describe(dispatch: kernel_dispatch.Dispatch) -> str:
    """What the engine records as `provenance.device.kernels`."""
    if not dispatch.uses_triton:
        return dispatch.describe()
    tail = "; attention over a cache not in the model's dtype (int8, int4): torch reference"
    return dispatch.describe(ENGINE_OPS) + tail


@dataclass(frozen=True)
class StepIndex:
    """One forward pass's index tensors for the attention kernels (built on the host once)."""

    block_tables: torch.Tensor  # [N, max_blocks] int32, padded with block 0
    context_lens: torch.Tensor  # [N] int32: each sequence's context after this step
    query_start_loc: torch.Tensor  # [N + 1] int32: where each sequence's rows start
    max_query_len: int
    max_context_len: int
    is_all_decode: bool  # one row per sequence: the split-K decode kernel
    block_size: int
    cos: torch.Tensor  # [P, d/2] float32 rotation tables for positions 0..P-1
    sin: torch.Tensor


@dataclass(frozen=True)
class PreparedBatch(AttentionBatch):
    """A decode step whose kernel index is built already, in static buffers that the caller
    refills before each run (a CUDA-graph decode step): `prepare` returns `step` as it is."""

    step: StepIndex | None = None


def cos_sin(rotations: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The rope kernel's float32 cos and sin tables [P, d/2] from the model's complex rotation
    table e^(i·pos·freq) [P, d/2]."""
    pairs = torch.view_as_real(rotations)  # [P, d/2, 2]: cos, sin
    return pairs[..., 0].contiguous(), pairs[..., 1].contiguous()


class TritonOps:
    """The kernels layer's Triton ops, in the model's calling conventions."""

    def __init__(self, dispatch: kernel_dispatch.Dispatch):
        # Imported here: the Triton kernel modules are needed only on this path.
        from llmbench.kernels import (
            decode_attention,
            kv_cache_write,
            prefill_attention,
            rms_norm,
            rope,
            silu_and_mul,
        )

        self.dispatch = dispatch
        self._rms_norm = rms_norm.rms_norm
        self._rope = rope.rope_
        self._silu_and_mul = silu_and_mul.silu_and_mul
        self._kv_cache_write = kv_cache_write.kv_cache_write
        self._decode = decode_attention.paged_decode_attention
        self._prefill = prefill_attention.chunked_prefill_attention
        self._table: torch.Tensor | None = None
        self._cos_sin: tuple[torch.Tensor, torch.Tensor] | None = None

    def prepare(self, batch: AttentionBatch, block_size: int, rotations: torch.Tensor) -> StepIndex:
        """The step's index tensors from its chunks, and cos/sin [P, d/2] from the rotary
        table `rotations` (complex [P, d/2]; recomputed only when the table grows). A
        `PreparedBatch` brings its own index: it is returned unchanged."""
        if isinstance(batch, PreparedBatch) and batch.step is not None:
            return batch.step
        chunks = batch.chunks
        device = batch.slot_mapping.device
        context_lens = [c.start + c.num_tokens for c in chunks]
        num_blocks = [-(-n // block_size) for n in context_lens]
        width = max(num_blocks)
        tables = [
            c.block_table[:k] + [0] * (width - k) for c, k in zip(chunks, num_blocks, strict=True)
        ]
        starts = [0]
        for c in chunks:
            starts.append(starts[-1] + c.num_tokens)
        if rotations is not self._table:
            self._cos_sin = cos_sin(rotations)
            self._table = rotations
        cos, sin = self._cos_sin
        return StepIndex(
            block_tables=to_device(tables, device, torch.int32),
            context_lens=to_device(context_lens, device, torch.int32),
            query_start_loc=to_device(starts, device, torch.int32),
            max_query_len=max(c.num_tokens for c in chunks),
            max_context_len=max(context_lens),
            is_all_decode=all(c.num_tokens == 1 for c in chunks),
            block_size=block_size,
            cos=cos,
            sin=sin,
        )

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        return self._rms_norm(x, weight, eps)

    def rope_(
        self, x: torch.Tensor, positions: torch.Tensor, step: StepIndex, head_dim: int
    ) -> None:
        self._rope(x, positions, step.cos, step.sin, head_dim)

    def silu_and_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        return self._silu_and_mul(gate_up)

    def attention(
        self,
        q: torch.Tensor,
        kv: torch.Tensor,
        cache: torch.Tensor | SplitLayer,
        batch: AttentionBatch,
        step: StepIndex,
        scale: float,
    ) -> torch.Tensor:
        """q [T, nh, d], kv [T, 2, nkv, d] → [T, nh, d], as `paged_attention`: kv written to
        the cache [S, 2, nkv, d] first, then every row attends over its context."""
        if not isinstance(cache, torch.Tensor) or cache.dtype != q.dtype:
            return paged_attention(q, kv, cache, batch, scale)
        key_cache, value_cache = cache[:, 0], cache[:, 1]  # [S, nkv, d] views, slot stride 2·nkv·d
        self._kv_cache_write(kv[:, 0], kv[:, 1], key_cache, value_cache, batch.slot_mapping)
        if step.is_all_decode:
            return self._decode(
                q,
                key_cache,
                value_cache,
                step.block_tables,
                step.context_lens,
                step.block_size,
                scale,
                step.max_context_len,
            )
        return self._prefill(
            q,
            key_cache,
            value_cache,
            step.block_tables,
            step.query_start_loc,
            step.context_lens,
            step.block_size,
            scale,
            step.max_query_len,
        )
