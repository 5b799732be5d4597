"""Decode steps from static buffers, captured once per batch-size bucket as CUDA graphs.

A decode step (one new token per sequence) launches ~15 kernels a layer; at small batches the
launches, not the work, set a GPU's step time. A CUDA graph records every launch of one step
once and replays them all with one call, at fixed addresses and shapes. So:

- batch sizes come in buckets (1, 2, 4, ... up to max_num_seqs): a step of n sequences runs the
  graph of the smallest bucket >= n, and its extra rows are padding that stores no K/V (slot -1),
  attends one position and is dropped;
- every input of a bucket lives in one static int32 buffer
  [ids | positions | slots | context lens | block tables]: a step packs its rows on the host and
  copies them in with one host→device copy, outside the graph, then replays;
- attention's split-K grid is sized for the longest context a graph serves (`max_context_len`),
  not the step's, and the rotary table is grown to it before anything is captured.

Where there is no CUDA the same static-buffer step runs eagerly (the tests run it under
Triton's CPU interpreter), so everything but capture and replay runs on a CPU.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from llmbench.engine import kernel_ops
from llmbench.engine.model import LlamaModel
from llmbench.engine.paged_attention import KVCache

# Longer contexts run eagerly: every graph's block table and split-K grid grow with this bound
# (8,192 tokens: 16 partitions of 512, most empty for short contexts).
MAX_GRAPH_CONTEXT_TOKENS = 8192
# Runs before capture, on a side stream: Triton compiles each kernel on its first launch, and
# compiling (or any lazy set-up) must not happen inside a capture.
NUM_WARMUP_RUNS = 2


def batch_buckets(max_num_seqs: int) -> tuple[int, ...]:
    """Batch sizes that get a graph: the powers of two below max_num_seqs, then max_num_seqs.

    Formula: (1, 2, 4, ..., 2^k, max_num_seqs), 2^k < max_num_seqs.
    """
    buckets, size = [], 1
    while size < max_num_seqs:
        buckets.append(size)
        size *= 2
    return (*buckets, max_num_seqs)


def bucket_for(num_seqs: int, buckets: Sequence[int]) -> int | None:
    """The smallest bucket that holds num_seqs rows (None: more than the largest)."""
    return next((b for b in buckets if b >= num_seqs), None)


@dataclass(frozen=True)
class DecodeRow:
    """One sequence of a decode step: its new token at `position`, its blocks."""

    token_id: int
    position: int
    block_table: Sequence[int]


def pack_decode_rows(
    rows: Sequence[DecodeRow], bucket: int, max_blocks: int, block_size: int
) -> list[int]:
    """A bucket's static buffer for `rows`: [ids | positions | slots | context lens] (bucket
    values each), then the block tables [bucket, max_blocks] row by row.

    Formula, real row r at position p: slot = table[p // block_size]·block_size + p % block_size,
    context len = p + 1, table = its first ceil((p + 1) / block_size) blocks, then 0s. A padding
    row: id 0, position 0, slot -1 (the K/V write skips it), context len 1 (it reads slot 0 of
    block 0, harmlessly), table all 0s.
    """
    if len(rows) > bucket:
        raise ValueError(f"pack_decode_rows: {len(rows)} rows do not fit bucket {bucket}")
    num_pad = bucket - len(rows)
    ids = [r.token_id for r in rows] + [0] * num_pad
    positions = [r.position for r in rows] + [0] * num_pad
    slots = [
        r.block_table[r.position // block_size] * block_size + r.position % block_size for r in rows
    ] + [-1] * num_pad
    context_lens = [r.position + 1 for r in rows] + [1] * num_pad
    tables = []
    for r in rows:
        blocks = list(r.block_table[: -(-(r.position + 1) // block_size)])
        tables += blocks + [0] * (max_blocks - len(blocks))
    tables += [0] * (max_blocks * num_pad)
    return ids + positions + slots + context_lens + tables


def why_not_graphed(model: LlamaModel, kv_cache: KVCache) -> str | None:
    """Why the model's decode steps cannot run from static buffers (None: they can)."""
    if model.kernels is None:
        return "the torch ops path"
    if kv_cache.kv is None or kv_cache.kv.dtype != model.dtype:
        return "a K/V cache not in the model's dtype runs torch attention"
    if model.config.is_moe:
        return "MoE routing counts tokens per expert on the host"
    return None


class StaticDecodeStep:
    """One bucket's static buffers and the decode step that reads only them: forward and
    logits for `bucket` rows, every index tensor a view of one int32 buffer."""

    def __init__(
        self,
        model: LlamaModel,
        kv_cache: KVCache,
        bucket: int,
        max_context_len: int,
        cos: torch.Tensor,
        sin: torch.Tensor,
    ):
        self.model, self.kv_cache, self.bucket = model, kv_cache, bucket
        self.max_blocks = -(-max_context_len // kv_cache.block_size)
        device = model.device
        size = bucket * (4 + self.max_blocks)
        self.packed = torch.zeros(size, dtype=torch.int32, device=device)
        ids, positions, slots, context_lens = self.packed[: 4 * bucket].view(4, bucket)
        self.input_ids, self.positions = ids, positions
        step = kernel_ops.StepIndex(
            block_tables=self.packed[4 * bucket :].view(bucket, self.max_blocks),
            context_lens=context_lens,
            query_start_loc=torch.arange(bucket + 1, dtype=torch.int32, device=device),
            max_query_len=1,
            max_context_len=max_context_len,
            is_all_decode=True,
            block_size=kv_cache.block_size,
            cos=cos,
            sin=sin,
        )
        self.batch = kernel_ops.PreparedBatch(
            slot_mapping=slots,
            prefills=[],
            decodes=None,
            max_position=max_context_len - 1,
            step=step,
        )
        self.load([])  # every row padding: a valid step before any data arrives

    def load(self, rows: Sequence[DecodeRow]) -> None:
        """Copy `rows` (padded to the bucket) into the static buffer: one host→device copy,
        from pinned memory and without blocking the host on CUDA."""
        values = pack_decode_rows(rows, self.bucket, self.max_blocks, self.kv_cache.block_size)
        host = torch.tensor(values, dtype=torch.int32)
        if self.packed.device.type == "cuda":
            host = host.pin_memory()
        self.packed.copy_(host, non_blocking=True)

    def forward(self) -> torch.Tensor:
        """Logits [bucket, V] (float32) of the rows in the buffer; writes their K/V."""
        hidden = self.model.forward(self.input_ids, self.positions, self.batch, self.kv_cache)
        return self.model.compute_logits(hidden)


@dataclass(frozen=True)
class CapturedStep:
    """A bucket's graph and the logits tensor [bucket, V] each replay overwrites."""

    graph: torch.cuda.CUDAGraph
    logits: torch.Tensor


def capture(step: StaticDecodeStep, pool: object) -> CapturedStep:
    """Warm `step` up on a side stream, then record it into a CUDA graph that allocates from
    `pool` (shared by every bucket). CUDA only."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(NUM_WARMUP_RUNS):
            step.forward()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        logits = step.forward()
    return CapturedStep(graph, logits)


def capture_all(steps: dict[int, StaticDecodeStep]) -> dict[int, CapturedStep]:
    """Every bucket's graph, largest first in one memory pool: a smaller graph's temporaries
    then fit in what the larger ones freed. CUDA only."""
    pool = torch.cuda.graph_pool_handle()
    captured = {b: capture(steps[b], pool) for b in sorted(steps, reverse=True)}
    torch.cuda.synchronize()
    return captured


def replay(captured: CapturedStep) -> torch.Tensor:
    """Queue the bucket's recorded step on the current stream; its logits [bucket, V]."""
    captured.graph.replay()
    return captured.logits


class DecodeGraphs:
    """Decode steps of up to max_num_seqs sequences through static buffers, one per bucket,
    replayed from CUDA graphs when `is_captured` (else run eagerly: the same buffers and ops)."""

    def __init__(self, model: LlamaModel, kv_cache: KVCache, max_num_seqs: int, capture: bool):
        reason = why_not_graphed(model, kv_cache)
        if reason is not None:
            raise ValueError(f"DecodeGraphs: {reason}; check why_not_graphed first")
        self.buckets = batch_buckets(max_num_seqs)
        self.max_context_len = min(
            MAX_GRAPH_CONTEXT_TOKENS, model.config.max_position_embeddings, kv_cache.num_tokens
        )
        # Grown now, so no step of a graph ever reallocates it.
        cos, sin = kernel_ops.cos_sin(model.rotary.rotations(self.max_context_len - 1))
        self.steps = {
            b: StaticDecodeStep(model, kv_cache, b, self.max_context_len, cos, sin)
            for b in self.buckets
        }
        t0 = time.perf_counter_ns()
        self.captured = capture_all(self.steps) if capture else {}
        self.capture_s = (time.perf_counter_ns() - t0) / 1e9

    @property
    def is_captured(self) -> bool:
        return bool(self.captured)

    def can_run(self, rows: Sequence[DecodeRow]) -> bool:
        """Whether a step of `rows` fits: at most the largest bucket, every context within
        max_context_len."""
        return 0 < len(rows) <= self.buckets[-1] and all(
            r.position < self.max_context_len for r in rows
        )

    def run(self, rows: Sequence[DecodeRow]) -> torch.Tensor:
        """Logits [len(rows), V] (float32) of one decode step; their K/V are written. The
        tensor is a view of the bucket's output: use it before the next `run`."""
        bucket = bucket_for(len(rows), self.buckets)
        step = self.steps[bucket]
        step.load(rows)
        logits = replay(self.captured[bucket]) if self.is_captured else step.forward()
        return logits[: len(rows)]

    def describe(self) -> str:
        """The line a run records next to its kernels."""
        what = "decode CUDA graphs" if self.is_captured else "decode steps from static buffers"
        sizes = ", ".join(str(b) for b in self.buckets)
        line = f"{what}: batch buckets {sizes}; contexts up to {self.max_context_len} tokens"
        return line + (f" (captured in {self.capture_s:.1f} s)" if self.is_captured else "")


def decode_graphs_for(
    model: LlamaModel, kv_cache: KVCache, max_num_seqs: int, is_enabled: bool
) -> tuple[DecodeGraphs | None, str | None]:
    """The engine's decode graphs and the line its run records about them: on CUDA, captured
    graphs (or None and why not); elsewhere (None, None), nothing changes."""
    if model.device.type != "cuda":
        return None, None
    if not is_enabled:
        return None, "decode CUDA graphs: off (cuda_graphs=False)"
    reason = why_not_graphed(model, kv_cache)
    if reason is not None:
        return None, f"decode CUDA graphs: off ({reason})"
    graphs = DecodeGraphs(model, kv_cache, max_num_seqs, capture=True)
    return graphs, graphs.describe()
