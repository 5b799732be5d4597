"""The measured roofs are real measurements: positive, and near what numpy sees."""

from __future__ import annotations

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


def test_ceilings_are_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("LLMBENCH_CACHE", str(tmp_path))
    calls = []
    monkeypatch.setattr(hardware, "measure", lambda device: calls.append(device) or {"x": 1})
    assert hardware.ceilings("cpu") == {"x": 1}
    assert hardware.ceilings("cpu") == {"x": 1}
    assert calls == ["cpu"]  # the second came from the cache
    hardware.ceilings("cpu", refresh=True)
    assert calls == ["cpu", "cpu"]


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
