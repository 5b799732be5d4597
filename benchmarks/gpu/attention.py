"""The paged decode attention kernel alone (`kernels.decode_attention`, the Triton kernels the
engine launches): `batch` queries over a random paged K/V cache of `context` tokens each, with
the model's heads, in its dtype, blocks scattered over the pool as a running engine leaves them.

  achieved = the kernel's bytes (`paged_decode_attention_cost`) / its best time
  fraction of the roof = achieved / the measured read roof   (the issue's target: >= 0.8 at
  batch 64, context 8k)
"""

from __future__ import annotations

import statistics
import time
from typing import Any

NUM_RUNS = 10
BLOCK_SIZE = 16  # the engine's


def attention_alone(
    config: Any, batch: int, context: int, dtype: str, device: str, read_bytes_per_s: float | None
) -> dict[str, Any]:
    import torch

    from llmbench.engine.engine import DTYPES
    from llmbench.kernels.decode_attention import (
        paged_decode_attention,
        paged_decode_attention_cost,
    )

    torch_dtype = DTYPES[dtype]
    nkv, nh, d = config.num_kv_heads, config.num_heads, config.head_dim
    blocks_per_seq = -(-context // BLOCK_SIZE)
    num_blocks = batch * blocks_per_seq
    generator = torch.Generator(device=device).manual_seed(0)
    # kv: [S, 2, nkv, d], K and V halves of one tensor as the engine stores a layer
    kv = torch.randn(
        num_blocks * BLOCK_SIZE, 2, nkv, d, device=device, dtype=torch_dtype, generator=generator
    )
    order = torch.randperm(num_blocks, device=device, generator=generator)
    tables = order.view(batch, blocks_per_seq).to(torch.int32)  # [B, max_blocks]
    lens = torch.full((batch,), context, dtype=torch.int32, device=device)
    q = torch.randn(batch, nh, d, device=device, dtype=torch_dtype, generator=generator)
    out = torch.empty_like(q)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)

    def run() -> float:
        sync()
        t0 = time.perf_counter()
        paged_decode_attention(
            q, kv[:, 0], kv[:, 1], tables, lens, BLOCK_SIZE, d**-0.5, context, out=out
        )
        sync()
        return time.perf_counter() - t0

    run()  # warm-up: compiles the kernels for this shape
    seconds = [run() for _ in range(NUM_RUNS)]
    cost = paged_decode_attention_cost([context] * batch, nh, nkv, d, torch_dtype, BLOCK_SIZE)
    achieved = cost.bytes / min(seconds)
    return {
        "batch": batch,
        "context": context,
        "dtype": dtype,
        "ms_best": min(seconds) * 1e3,
        "ms_median": statistics.median(seconds) * 1e3,
        "bytes": cost.bytes,
        "bytes_per_s": achieved,
        "roof_fraction": achieved / read_bytes_per_s if read_bytes_per_s else None,
    }
