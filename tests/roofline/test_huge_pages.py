from __future__ import annotations

import mmap

import pytest
import torch

from llmbench.roofline import huge_pages


def test_a_buffer_is_the_bytes_asked_for_all_ones_and_float32():
    buffer = huge_pages.new_buffer(6 << 20, "cpu")
    assert buffer.dtype == torch.float32 and buffer.device.type == "cpu"
    assert buffer.numel() == (6 << 20) // 4 and buffer.is_contiguous()
    assert float(buffer.sum()) == (6 << 20) // 4  # every element 1.0: every page touched
    buffer += 1  # writable: a kernel can write into it (copy, triad)
    assert float(buffer[-1]) == 2.0


def test_without_madvise_a_buffer_is_torch_ones(monkeypatch):
    """An OS without MADV_HUGEPAGE (not Linux) gets torch's own allocation, silently."""
    monkeypatch.delattr(mmap, "MADV_HUGEPAGE", raising=False)
    buffer = huge_pages.new_buffer(1 << 20, "cpu")
    assert buffer.numel() == 1 << 18 and float(buffer.sum()) == 1 << 18


def test_smaps_rollup_bytes_are_read_in_kib():
    text = (
        "00400000-7ffd5000 ---p 00000000 00:00 0                          [rollup]\n"
        "Rss:              812340 kB\n"
        "AnonHugePages:    196608 kB\n"
        "ShmemPmdMapped:        0 kB\n"
    )
    assert huge_pages.rollup_bytes(text, "AnonHugePages") == 196608 * 1024 == 192 << 20
    assert huge_pages.rollup_bytes(text, "Rss") == 812340 * 1024
    assert huge_pages.rollup_bytes(text, "FilePmdMapped") is None


def test_anon_huge_page_bytes_is_none_without_the_file(tmp_path):
    assert huge_pages.anon_huge_page_bytes(tmp_path / "absent") is None
    (tmp_path / "rollup").write_text("AnonHugePages:    2048 kB\n")
    assert huge_pages.anon_huge_page_bytes(tmp_path / "rollup") == 2 << 20


@pytest.mark.parametrize(
    "before, after, num_bytes, share",
    [
        (0, 576 << 20, 576 << 20, 1.0),  # all on huge pages
        (4 << 20, 4 << 20, 576 << 20, 0.0),  # none: THP `never`, or no 2 MiB page free
        (0, 288 << 20, 576 << 20, 0.5),
        (0, 580 << 20, 576 << 20, 1.0),  # another allocation's huge pages at the same time
        (8 << 20, 2 << 20, 576 << 20, 0.0),  # some freed meanwhile: not negative
        (None, 576 << 20, 576 << 20, None),  # no smaps_rollup
    ],
)
def test_huge_share(before, after, num_bytes, share):
    assert huge_pages.huge_share(before, after, num_bytes) == share
