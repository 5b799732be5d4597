"""Small host lists (indices, per-row settings) to device tensors without stalling the host.

`torch.tensor(values, device="cuda")` copies from pageable memory and then waits for the whole
stream, so the host stops until every kernel queued before it has finished: one such call in a
step's bookkeeping serialises the host with the GPU. On CUDA `to_device` stages the values in
pinned memory and queues a non-blocking copy instead (torch's pinned-memory cache keeps the
staging block until the copy has run); on a CPU it is `torch.tensor(values)`, as before.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def to_device(
    values: Sequence, device: torch.device, dtype: torch.dtype | None = None
) -> torch.Tensor:
    """`values` (numbers, or equal-length lists of them) as a tensor on `device`, ordered on the
    current stream before whatever is queued next; no host sync on CUDA."""
    host = torch.tensor(values, dtype=dtype)
    if device.type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)
