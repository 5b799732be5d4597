"""Weights and K/V on huge pages (`engine.huge_pages`): the move keeps every value and every
view, the smaps reading by hand, and an engine that asks decodes exactly as one that does not."""

from __future__ import annotations

import torch

from llmbench.engine import huge_pages
from llmbench.engine.engine import EngineConfig, LLMEngine
from llmbench.engine.sampling import SamplingParams

SMAPS = """\
7f0000000000-7f0000600000 rw-p 00000000 00:00 0
Size:               6144 kB
Rss:                6144 kB
AnonHugePages:      4096 kB
THPeligible:    1
7f0000600000-7f0000601000 r--p 00000000 08:01 1234                       /usr/lib/x.so
Size:                  4 kB
AnonHugePages:         0 kB
7f0000800000-7f0000c00000 rw-p 00000000 00:00 0
Size:               4096 kB
AnonHugePages:      2048 kB
"""


def test_huge_bytes_of_smaps_by_hand():
    base = 0x7F0000000000
    mib = 1024 * 1024
    # The whole first mapping: its 4 MiB of huge pages.
    assert huge_pages.huge_bytes_of_smaps(SMAPS, base, 6 * mib) == 4 * mib
    # 1 MiB of it: at most the overlap.
    assert huge_pages.huge_bytes_of_smaps(SMAPS, base + mib, mib) == mib
    # Across the file mapping into the third: 4 MiB + 0 + 2 MiB.
    assert huge_pages.huge_bytes_of_smaps(SMAPS, base, 12 * mib) == 6 * mib
    # Nothing mapped there: not known.
    assert huge_pages.huge_bytes_of_smaps(SMAPS, base + 64 * mib, mib) is None


def test_page_report_share():
    assert huge_pages.PageReport(200, 150).huge_share == 0.75
    assert huge_pages.PageReport(200, None).huge_share is None
    assert huge_pages.PageReport(0, None).huge_share is None


def test_allocate_starts_on_a_huge_page_boundary_with_zeros():
    buffer = huge_pages.allocate(3 * 1024 * 1024 + 5)
    assert buffer.dtype == torch.uint8 and buffer.numel() == 3 * 1024 * 1024 + 5
    assert buffer.data_ptr() % huge_pages.HUGE_PAGE_BYTES == 0
    assert not buffer.any()
    kv = huge_pages.zeros((4, 2, 3, 8), torch.bfloat16)
    assert kv.shape == (4, 2, 3, 8) and kv.dtype == torch.bfloat16 and kv.is_contiguous()
    assert not kv.any()


def test_a_move_keeps_values_views_and_holders():
    g = torch.Generator().manual_seed(0)
    table = torch.randn(100, 16, generator=g).bfloat16()
    rows = table[10:20]  # a view: it must follow its storage
    scales = torch.randn(7, generator=g)
    holder = {"w": table, "rows": rows}  # another holder of the same tensor objects
    expected = (table.clone(), rows.clone(), scales.clone())
    report = huge_pages.move_to_huge_pages([table, rows, scales])
    assert torch.equal(table, expected[0]) and torch.equal(rows, expected[1])
    assert torch.equal(scales, expected[2])
    assert holder["w"] is table  # the same objects, pointed at the copy: one mapping for all
    assert rows.untyped_storage().data_ptr() == scales.untyped_storage().data_ptr()
    assert rows.data_ptr() - table.data_ptr() == 10 * 16 * 2
    # Two storages, each rounded up to 64 bytes: 100·16·2 = 3,200 and 7·4 = 28 → 64.
    assert report.num_bytes == 3200 + 64
    assert table.data_ptr() % huge_pages.HUGE_PAGE_BYTES == 0
    if report.huge_bytes is not None:
        assert 0 <= report.huge_bytes <= report.num_bytes
    table[10, 0] = 5.0  # the view still sees the table's memory
    assert rows[0, 0].item() == 5.0


def test_nothing_to_move_is_an_empty_report():
    assert huge_pages.move_to_huge_pages([]) == huge_pages.PageReport(0, None)


def test_an_engine_on_huge_pages_decodes_as_one_without():
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    outputs, engines = [], []
    for on in (True, False):
        engine = LLMEngine(
            EngineConfig(model="synthetic:tiny", dtype="bfloat16", device="cpu", huge_pages=on)
        )
        engines.append(engine)
        tokens = [t for out in engine.stream([1, 2, 3, 4, 5], params) for t in out.new_token_ids]
        outputs.append(tokens)
    on, off = engines
    assert outputs[0] == outputs[1] and len(outputs[0]) == 12
    assert off.weight_pages is None
    # Every storage the model held before the move, each rounded up to 64 bytes.
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage() for t in off.model.tensors()}
    expected = sum(-(-storage.nbytes() // 64) * 64 for storage in storages.values())
    assert on.weight_pages.num_bytes == expected
    assert on.model.embed_tokens.data_ptr() % huge_pages.HUGE_PAGE_BYTES == 0
