"""The measured roofs: real measurements near what numpy sees, sized and bounded by time, cached
per probe with where each number came from."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

from llmbench.harness import hardware
from llmbench.harness.hardware import HARDWARE


def test_measured_bandwidth_is_within_10x_of_a_numpy_copy():
    roofs = hardware.measure("cpu")
    src = np.ones(1 << 26, dtype=np.float32)  # 256 MiB
    dst = np.empty_like(src)
    np.copyto(dst, src)
    seconds = []
    for _ in range(3):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        seconds.append(time.perf_counter() - t0)
    numpy_copy = 2 * src.nbytes / min(seconds)  # read + write, as llmbench counts a copy
    assert 0.1 * numpy_copy < roofs["copy_bytes_per_s"] < 10 * numpy_copy
    assert 0.1 * numpy_copy < roofs["read_bytes_per_s"] < 10 * numpy_copy
    # torch 2.13's CPU build has an int8 x int8 -> int32 matmul, so int8 is measured too.
    for dtype in ("float32", "bfloat16", "float16", "int8"):
        assert 1e8 < roofs["matmul_flops_per_s"][dtype] < 1e15  # 0.1 GFLOP/s .. 1 PFLOP/s


def test_measuring_respects_a_tiny_budget():
    """Bandwidth is always measured; the matmuls get what is left of 0.3 s, and a dtype with no
    time left is skipped and named: the whole call ends within a probe's overshoot."""
    t0 = time.perf_counter()
    roofs = hardware.measure("cpu", budget_s=0.3)
    elapsed_s = time.perf_counter() - t0
    assert elapsed_s < 0.3 + 2.5, elapsed_s
    assert roofs["read_bytes_per_s"] > 0 and roofs["copy_bytes_per_s"] > 0
    measured, skipped = set(roofs["matmul_flops_per_s"]), set(roofs["skipped"])
    assert measured | skipped == set(hardware.MATMUL_DTYPES) and skipped
    for dtype in skipped:
        assert (
            f"matmul {dtype}: not measured, the time budget was spent (a later run measures it)"
            in roofs["notes"]
        )


def slow_matmul(flops_per_s: float):
    """A stand-in for a dtype with no fast path: an n×n matmul that takes 2n³ / rate seconds."""

    def make(dtype, n, device):
        return lambda: time.sleep(2 * n**3 / flops_per_s)

    return make


def test_a_slow_dtype_is_measured_small_and_says_so(monkeypatch):
    # At 0.5 GFLOP/s: 256² takes 67 ms, so 512² (0.54 s) is a run under MAX_RUN_S = 0.75 s and
    # 1024² (4.3 s) is not: the probe stops at 512, 100x below a dtype that reached 2048².
    monkeypatch.setitem(hardware.MATMULS, "float16", slow_matmul(0.5e9))
    monkeypatch.setitem(hardware.MATMULS, "bfloat16", slow_matmul(500e9))  # 2048²: 34 ms
    roofs = hardware.measure("cpu", dtypes=("bfloat16", "float16"), with_bandwidth=False)
    assert (
        roofs["probes"]["bfloat16"]["size"] == 2048 and roofs["probes"]["bfloat16"]["note"] is None
    )
    probe = roofs["probes"]["float16"]
    assert probe["size"] == 512
    assert roofs["matmul_flops_per_s"]["float16"] == pytest.approx(0.5e9, rel=0.2)
    assert roofs["notes"] == [probe["note"]]
    assert probe["note"].startswith("matmul float16: measured at 512x512, not 2048x2048")
    assert probe["note"].endswith("below bfloat16: no fast path for it here")
    assert "read_bytes_per_s" not in roofs


def test_size_by_time_grows_a_fast_probe_to_full_size():
    sizes = []

    def make(n):
        sizes.append(n)
        return lambda: None

    n, times = hardware.size_by_time(make, lambda: None, 256, 2048, cap_s=5.0)
    assert (n, sizes) == (2048, [256, 512, 1024, 2048])
    assert len(times) == hardware.REPEATS


def fake_measure(calls):
    def measure(device, budget_s, dtypes, with_bandwidth, progress):
        calls.append((list(dtypes), with_bandwidth))
        probe = {"size": 1, "repeats": 1, "seconds": 1.0, "measured_unix_s": 0.0, "note": None}
        out = {
            "device": "cpu0",
            "device_type": "cpu",
            "threads": 2,
            "torch": "2.13.0",
            "method": "best of fake runs",
            "matmul_flops_per_s": {d: 1e9 for d in dtypes if d != "float16"},
            "probes": {d: probe for d in dtypes if d != "float16"},
            "skipped": ["float16"] if "float16" in dtypes else [],
            "unsupported": [],
            "notes": [],
        }
        if with_bandwidth:
            out.update(copy_bytes_per_s=2e9, read_bytes_per_s=3e9)
            out["probes"] |= {"copy": probe, "read": probe}
        return out

    return measure


def test_ceilings_measure_only_what_the_cache_lacks(tmp_path, monkeypatch):
    monkeypatch.setenv("LLMBENCH_CACHE", str(tmp_path))
    calls = []
    monkeypatch.setattr(hardware, "measure", fake_measure(calls))
    first = hardware.ceilings("cpu", first="bfloat16")
    # The run's dtype first; float16 was skipped (over budget): not cached as measured.
    assert calls == [(["bfloat16", "float32", "float16", "int8"], True)]
    assert set(first["matmul_flops_per_s"]) == {"bfloat16", "float32", "int8"}
    assert first["sources"]["read"] == "measured now"
    assert "skipped" not in first and "unsupported" not in first

    second = hardware.ceilings("cpu")
    assert calls[1] == (["float16"], False)  # only the dtype it lacked, no bandwidth again
    (cache_file,) = (tmp_path / "hardware").iterdir()
    date = time.strftime("%Y-%m-%d %H:%M", time.localtime(0))  # measured_unix_s 0
    assert second["sources"]["read"] == f"cache {cache_file} (measured {date})"
    assert second["sources"]["float32"].startswith(f"cache {cache_file}")

    hardware.ceilings("cpu", refresh=True)
    assert calls[2] == (["float32", "bfloat16", "float16", "int8"], True)


def test_a_complete_cache_measures_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("LLMBENCH_CACHE", str(tmp_path))
    calls = []
    fake = fake_measure(calls)
    monkeypatch.setattr(
        hardware,
        "measure",
        lambda device, budget_s, dtypes, with_bandwidth, progress: {
            **fake(device, budget_s, [d for d in dtypes if d != "float16"], with_bandwidth, None),
            "unsupported": ["float16"] if "float16" in dtypes else [],
        },
    )
    roofs = hardware.ceilings("cpu")
    assert roofs["notes"] == ["matmul float16: torch has none on this device"]
    hardware.ceilings("cpu")
    assert len(calls) == 1  # float16 is known to be missing: not tried again


def test_hardware_table_is_data():
    keys = {"memory_bandwidth_bytes_per_s", "flops_per_s", "memory_bytes", "interconnect"}
    dtypes = {"float32", "bfloat16", "float16", "int8"}
    for name, spec in HARDWARE.items():
        assert set(spec) == keys, name
        assert set(spec["flops_per_s"]) == dtypes, name
    assert HARDWARE["H100-SXM"]["memory_bandwidth_bytes_per_s"] == 3.35e12
    assert HARDWARE["H100-SXM"]["flops_per_s"]["bfloat16"] == 989e12


@pytest.mark.parametrize(
    "device, key",
    [
        ("NVIDIA H100 80GB HBM3", "H100-SXM"),
        ("NVIDIA H100 PCIe", "H100-PCIe"),
        ("NVIDIA A100-SXM4-40GB", "A100-40GB"),
        ("NVIDIA A100-SXM4-80GB", "A100-80GB"),
        ("NVIDIA L4", "L4"),
        ("NVIDIA L40S", "L40S"),
        ("NVIDIA GeForce RTX 4090", "RTX-4090"),
        ("AMD EPYC 7B13 64-Core Processor", None),
    ],
)
def test_device_names_map_to_their_datasheet(device, key):
    assert hardware.datasheet_name_of(device) == key


def test_a_cache_of_medians_is_measured_again(tmp_path, monkeypatch):
    """Roofs cached by an llmbench that kept the median of its runs, not the best, are stale."""
    monkeypatch.setenv("LLMBENCH_CACHE", str(tmp_path))
    path = hardware._cache_path("old")
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"method": "median of up to 5 runs", "probes": {}}))
    assert hardware._read_cache(path) is None
    path.write_text(json.dumps({"method": "best of up to 6x10", "probes": {}}))
    assert hardware._read_cache(path) is not None
