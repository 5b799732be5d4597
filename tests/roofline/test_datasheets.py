"""The datasheet table's lookups and the host links' bandwidths."""

from __future__ import annotations

import pytest

from llmbench.errors import UserError
from llmbench.roofline import datasheets
from llmbench.roofline.datasheets import HARDWARE, datasheet, datasheet_name_of, link_bandwidth


def test_link_bandwidths_from_the_hardware_table_or_a_number():
    assert link_bandwidth("pcie4-x16") == link_bandwidth("pcie4") == 32e9
    assert link_bandwidth("pcie3") == 16e9
    assert link_bandwidth("12.5GB/s") == 12.5e9
    for bad in ("12.5", "0GB/s", "fastGB/s"):
        with pytest.raises(UserError):
            link_bandwidth(bad)


def test_datasheet_names_in_any_case_or_alias_and_from_a_driver_name():
    assert datasheet("h100") is datasheet("H100-SXM") is datasheet("h100-sxm")
    assert datasheet("abacus") is None
    assert datasheet_name_of("NVIDIA H100 80GB HBM3") == "H100-SXM"
    assert datasheet_name_of("NVIDIA H100 PCIe") == "H100-PCIe"
    assert datasheet_name_of("Intel(R) Xeon(R) Processor") is None


def test_hardware_table_is_data():
    keys = {
        "memory_bandwidth_bytes_per_s",
        "flops_per_s",
        "memory_bytes",
        "interconnect",
        "host_link_bytes_per_s",
    }
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
    assert datasheets.datasheet_name_of(device) == key
