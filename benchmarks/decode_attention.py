"""The C++ extension's paged decode attention alone, at SmolLM2-135M's heads, its K/V read from
memory and from cache, beside a plain read of the same bytes.

    python benchmarks/decode_attention.py [--streams 1 32] [--context 512 2048] [--repeats 7]

One pass runs the op once per layer for 30 layers, each layer with its own pool of every
stream's keys and values (9 query heads, 3 KV heads, head_dim 64, bfloat16, blocks of 16 slots
in a shuffled order, as a long-running cache leaves them, on 2 MiB pages as the engine allocates
them), so that a pass reads each layer's K/V from memory, as a decode step does. Each cell is
the median of `--repeats` passes after a warm-up pass. The columns:

- `memory`: the op over the 30 pools, in ms a pass and in GB/s of K/V read (streams · context ·
  2 · KV heads · head_dim · 2 bytes a layer);
- `cache`: the op over one pool 30 times: what the kernel does with its data in cache;
- `read`: a plain read (`sum`) of the same 30 pools: the roof for `memory` in this sitting.

The kernel reaches the roof when `memory` is close to `read`; where `memory` is far below both
other columns, its memory traffic and its products do not overlap.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from llmbench.engine import huge_pages
from llmbench.engine.kernel_ops import cpu_extension
from llmbench.kernels import cpu_layer_ops

NUM_LAYERS = 30
NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, BLOCK_SIZE = 9, 3, 64, 16
ROW = "{:>7} {:>7} {:>9}   {:>9} {:>5}   {:>8} {:>5}   {:>9}"


@dataclass
class Batch:
    """One decode step's attention inputs: q, the layers' K/V pools, block tables, lengths."""

    q: torch.Tensor  # [streams, heads, d]
    pools: list[torch.Tensor]  # per layer: [slots, 2, kv heads, d], K and V halves of a slot
    tables: torch.Tensor  # [streams, blocks] int32, every block of a pool used once
    lens: torch.Tensor  # [streams] int32

    @property
    def kv_bytes(self) -> int:
        """Formula: layers · streams · context · 2 · kv heads · d · element size."""
        per_layer = int(self.lens.sum()) * 2 * NUM_KV_HEADS * HEAD_DIM * self.q.element_size()
        return len(self.pools) * per_layer


def make_batch(streams: int, context: int, num_pools: int, seed: int = 0) -> Batch:
    """`num_pools` distinct layer pools (repeated to NUM_LAYERS) of `streams` sequences of
    `context` positions, their blocks shuffled, on huge pages where the OS gives them."""
    g = torch.Generator().manual_seed(seed)
    blocks_per_stream = -(-context // BLOCK_SIZE)
    num_blocks = streams * blocks_per_stream
    shape = (num_blocks * BLOCK_SIZE, 2, NUM_KV_HEADS, HEAD_DIM)
    distinct = []
    for _ in range(num_pools):
        pool = huge_pages.zeros(shape, torch.bfloat16)
        pool.copy_(torch.randn(shape, generator=g))
        distinct.append(pool)
    order = torch.randperm(num_blocks, generator=g).view(streams, blocks_per_stream)
    return Batch(
        q=torch.randn(streams, NUM_HEADS, HEAD_DIM, generator=g).bfloat16(),
        pools=[distinct[layer % num_pools] for layer in range(NUM_LAYERS)],
        tables=order.to(torch.int32).contiguous(),
        lens=torch.full((streams,), context, dtype=torch.int32),
    )


def attention_pass(batch: Batch) -> Callable[[], list[torch.Tensor]]:
    """One pass of the op over every layer's pool: returns each layer's output. The op is
    called as the engine's C++ decode layer calls it, without `cpu_layer_ops`' argument checks
    (~10 us a call in Python, a third of a one-stream layer's attention); the arguments are
    checked once, on the first pool."""
    backend = cpu_extension()
    scale = 1 / math.sqrt(HEAD_DIM)
    context = int(batch.lens.max())
    first = batch.pools[0]
    args = (batch.tables, batch.lens, BLOCK_SIZE, scale, context)
    cpu_layer_ops.paged_decode_attention(backend, batch.q, first[:, 0], first[:, 1], *args)
    op = backend.op(cpu_layer_ops.DECODE_ATTENTION_OP)
    return lambda: [op(batch.q, pool[:, 0], pool[:, 1], *args) for pool in batch.pools]


def read_pass(batch: Batch) -> Callable[[], float]:
    """A plain read of every layer's pool (viewed as float32), as the roof probe reads."""
    return lambda: sum(float(pool.view(torch.float32).sum()) for pool in batch.pools)


def median_seconds(run: Callable[[], object], repeats: int) -> float:
    """Median wall time of `repeats` calls after one warm-up call."""
    run()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        run()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--context", type=int, nargs="+", default=[512, 2048])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    backend = cpu_extension()
    if not backend.is_extension:
        raise SystemExit(f"decode_attention.py: needs the C++ extension ({backend.reason})")
    print(f"threads {torch.get_num_threads()}, {backend.describe()}")
    header = (
        "streams",
        "context",
        "MB a pass",
        "memory ms",
        "GB/s",
        "cache ms",
        "GB/s",
        "read GB/s",
    )
    print(ROW.format(*header))
    for streams in args.streams:
        for context in args.context:
            from_memory = make_batch(streams, context, NUM_LAYERS)
            from_cache = make_batch(streams, context, 1)
            gb = from_memory.kv_bytes / 1e9
            t_memory = median_seconds(attention_pass(from_memory), args.repeats)
            t_cache = median_seconds(attention_pass(from_cache), args.repeats)
            t_read = median_seconds(read_pass(from_memory), args.repeats)
            cells = (f"{gb * 1e3:.1f}", f"{t_memory * 1e3:.2f}", f"{gb / t_memory:.1f}")
            cells += (f"{t_cache * 1e3:.2f}", f"{gb / t_cache:.1f}", f"{gb / t_read:.1f}")
            print(ROW.format(streams, context, *cells), flush=True)
            del from_memory, from_cache


if __name__ == "__main__":
    main()
