"""Bandwidth-probe buffers on huge pages, where the OS gives them.

With transparent huge pages set to `madvise` (this project's VMs) torch's own allocations get
4 KiB pages; where they are `always`, an allocation may get 2 MiB pages or not, by luck. A read
over 4 KiB pages needs a TLB entry per 4 KiB and ran 25-27 GB/s here, over 2 MiB pages 29-30 GB/s
(576 MiB, Intel Xeon VM, 2 threads): a probe that sometimes gets them measures two machines. So
the probe asks for them (an anonymous mapping with `MADV_HUGEPAGE`, as the engine asks for its
weights: `engine.huge_pages`) and says how much of its buffers it got (`anon_huge_page_bytes`
before and after).
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

SMAPS_ROLLUP = Path("/proc/self/smaps_rollup")


def new_buffer(num_bytes: int, device: Any) -> Any:
    """A float32 tensor of `num_bytes` // 4 ones on `device`, every page touched: on a CPU in
    an anonymous mapping advised onto huge pages (`engine.huge_pages.allocate`: 4 KiB pages
    where the OS has none to give, silently); elsewhere `torch.ones`."""
    import torch

    numel = num_bytes // 4
    if torch.device(device).type != "cpu" or not numel:
        return torch.ones(numel, dtype=torch.float32, device=device)
    from llmbench.engine.huge_pages import allocate  # torch: loaded with the probes only

    # first touch: the page faults happen here, not in a timed run
    return allocate(4 * numel).view(torch.float32).fill_(1.0)


def anon_huge_page_bytes(rollup: Path = SMAPS_ROLLUP) -> int | None:
    """This process's anonymous memory on transparent huge pages (`AnonHugePages` of
    /proc/self/smaps_rollup), in bytes; None where the file does not say."""
    with contextlib.suppress(OSError):
        return rollup_bytes(rollup.read_text(), "AnonHugePages")
    return None


def rollup_bytes(text: str, key: str) -> int | None:
    """`key`'s value in smaps_rollup `text` ("AnonHugePages:    196608 kB" → 201326592)."""
    for line in text.splitlines():
        name, _, value = line.partition(":")
        if name == key and value.split()[1:] == ["kB"]:
            return int(value.split()[0]) * 1024
    return None


def huge_share(
    huge_bytes_before: int | None, huge_bytes_after: int | None, num_bytes: int
) -> float | None:
    """The share of `num_bytes` just allocated that landed on huge pages, from
    `anon_huge_page_bytes` before and after (None when either is unknown).

    Formula: min(1, max(0, after − before) / num_bytes).
    """
    if huge_bytes_before is None or huge_bytes_after is None or num_bytes <= 0:
        return None
    return min(1.0, max(0, huge_bytes_after - huge_bytes_before) / num_bytes)
