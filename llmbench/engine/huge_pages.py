"""The weights and the K/V cache a CPU decode step streams, on 2 MiB pages where the OS gives them.

A decode step reads every weight once, and the K/V of every context. Over 4 KiB pages each 4 KiB
needs its own TLB entry; over 2 MiB pages one entry covers 512 times as much. Measured on a
2-core Intel Xeon VM (2 threads, SmolLM2-135M's 120 layer matrices, bfloat16, one row): 22.1
GB/s on torch's own allocation, 26.8 GB/s on huge pages; whole decode steps 68 vs 74 tok/s
(float32 43 vs 46, int8 131 vs 135). With transparent huge pages set to `madvise` (this
project's VMs) torch's allocations never get them; set to `always`, a large allocation gets
them or not by luck — one way a process settles into one of two decode speeds.

So on a CPU the engine asks: one anonymous mapping, advised with MADV_HUGEPAGE and aligned to
2 MiB, holds every weight (`move_to_huge_pages`, after the model is built: each tensor's
storage is copied in and the tensor pointed at it, so every holder of the tensor follows), and
the K/V cache is allocated the same way (`zeros`, its pages touched at load as torch's zeros
touch them, so that no 2 MiB page is faulted in and cleared inside a measured step).
`PageReport` says how much of the weights the kernel really backed with huge pages
(`AnonHugePages` of the mapping in /proc/self/smaps): a run records it, so two runs that differ
in it are known to.
"""

from __future__ import annotations

import contextlib
import mmap
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import torch

HUGE_PAGE_BYTES = 2 * 1024 * 1024
ALIGN_BYTES = 64  # each storage starts on a cache line (and on any element size)
SMAPS = Path("/proc/self/smaps")


@dataclass(frozen=True)
class PageReport:
    """Where a set of tensors lies: `num_bytes` in all, `huge_bytes` of them on 2 MiB pages
    (None: unknown — no /proc/self/smaps, or nothing was moved)."""

    num_bytes: int
    huge_bytes: int | None

    @property
    def huge_share(self) -> float | None:
        """Formula: huge_bytes / num_bytes (None when either is unknown or 0)."""
        if self.huge_bytes is None or self.num_bytes <= 0:
            return None
        return min(1.0, self.huge_bytes / self.num_bytes)


def allocate(num_bytes: int) -> torch.Tensor:
    """`num_bytes` of zeros (uint8) in an anonymous mapping advised onto huge pages, starting
    on a 2 MiB boundary; on 4 KiB pages, silently, where the OS has none to give."""
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS
    memory = mmap.mmap(-1, num_bytes + HUGE_PAGE_BYTES, flags=flags)
    with contextlib.suppress(OSError, AttributeError):  # THP `never`, or no MADV_HUGEPAGE
        memory.madvise(mmap.MADV_HUGEPAGE)
    # The tensor holds a reference to `memory`: unmapped when the last view is freed.
    whole = torch.frombuffer(memory, dtype=torch.uint8)
    start = -whole.data_ptr() % HUGE_PAGE_BYTES
    return whole[start : start + num_bytes]


def zeros(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A CPU tensor of zeros on huge pages (`allocate`), every page touched now (as
    `torch.zeros` touches them): no page fault lands in a measured step."""
    numel = 1
    for size in shape:
        numel *= size
    element = torch.empty(0, dtype=dtype).element_size()
    return allocate(numel * element).view(dtype).view(shape).zero_()


def move_to_huge_pages(tensors: Iterable[torch.Tensor]) -> PageReport:
    """Copy the storages of `tensors` (CPU ones; each storage once, however many of them share
    it) into one huge-page mapping and point every one of them at its copy, in place
    (`Tensor.set_`): whoever holds one of these tensors reads the new memory. A tensor not in
    `tensors` that shares a storage keeps the old one. Returns where the moved bytes lie."""
    storages: dict[int, dict[int, torch.Tensor]] = {}  # storage → its tensors, each once
    for t in tensors:
        if t.device.type == "cpu" and t.untyped_storage().nbytes():
            storages.setdefault(t.untyped_storage().data_ptr(), {})[id(t)] = t
    if not storages:
        return PageReport(0, None)
    groups = [list(group.values()) for group in storages.values()]
    sizes = [
        -(-group[0].untyped_storage().nbytes() // ALIGN_BYTES) * ALIGN_BYTES for group in groups
    ]
    arena = allocate(sum(sizes))
    arena_storage = arena.untyped_storage()
    base = arena.data_ptr() - arena_storage.data_ptr()  # the arena's byte offset in its storage
    offset = 0
    with torch.no_grad():
        for group, size in zip(groups, sizes, strict=True):
            old = group[0].untyped_storage()
            source = torch.empty(0, dtype=torch.uint8).set_(old)  # the old storage as bytes
            arena[offset : offset + old.nbytes()].copy_(source)
            for t in group:
                start = (base + offset) // t.element_size() + t.storage_offset()
                t.set_(arena_storage, start, t.size(), t.stride())
            offset += size
    return PageReport(offset, huge_bytes_in(arena.data_ptr(), offset))


def huge_bytes_in(address: int, num_bytes: int, smaps: Path = SMAPS) -> int | None:
    """Bytes of [address, address + num_bytes) on transparent huge pages, from the
    `AnonHugePages` of the mappings that overlap it in `smaps` (None where the file does not
    say): each mapping's, up to its overlap with the range. Taken right after the mapping is
    filled, before a neighbour advised the same way can merge with it (the kernel merges
    adjacent anonymous mappings with equal flags)."""
    try:
        text = smaps.read_text()
    except OSError:
        return None
    return huge_bytes_of_smaps(text, address, num_bytes)


def huge_bytes_of_smaps(text: str, address: int, num_bytes: int) -> int | None:
    """`huge_bytes_in` over the text of a /proc/<pid>/smaps."""
    end = address + num_bytes
    total, found = 0, False
    start = stop = 0
    for line in text.splitlines():
        head = line.split(maxsplit=1)[0] if line.strip() else ""
        if "-" in head and not head.endswith(":"):  # "7f12...-7f13... rw-p ..." opens a mapping
            low, _, high = head.partition("-")
            with contextlib.suppress(ValueError):
                start, stop = int(low, 16), int(high, 16)
            continue
        if head == "AnonHugePages:" and start < end and address < stop:
            overlap = min(end, stop) - max(address, start)
            total += min(int(line.split()[1]) * 1024, overlap)
            found = True
    return total if found else None
