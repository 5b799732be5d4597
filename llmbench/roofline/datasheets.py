"""Datasheet peaks of accelerators and host links: the second line on a roofline, and the
hardware of `llmbench roofline`'s what-ifs (no measurement: the vendors' numbers, with their
sources in comments)."""

from __future__ import annotations

from typing import Any

from llmbench.errors import UserError

# Host links, bytes per second per direction (what offloaded weights cross to reach the GPU).
# PCI-SIG base specifications: PCIe 3.0 8 GT/s, 4.0 16 GT/s, 5.0 32 GT/s per lane, 128b/130b
# encoding, so an x16 link signals 15.75, 31.5 and 63.0 GB/s each way; datasheets round to
# 16 / 32 / 64 (and quote 64 / 128 "bidirectional"). Transfers reach ~80% of it in practice.
LINKS: dict[str, float] = {
    "pcie3-x16": 16e9,
    "pcie4-x16": 32e9,
    "pcie5-x16": 64e9,
}
_PCIE4_X16, _PCIE5_X16 = LINKS["pcie4-x16"], LINKS["pcie5-x16"]


def link_bandwidth(link: str) -> float:
    """Bytes/s of a simulated link: `pcie4-x16` (or `pcie4`) from the table, or `25GB/s`."""
    name = link if link in LINKS else f"{link}-x16"
    if name in LINKS:
        return LINKS[name]
    number = link.removesuffix("GB/s")
    try:
        value = float(number) * 1e9 if number != link else None
    except ValueError:
        value = None
    if value is None or not value > 0:
        raise UserError(
            f"link {link!r}: use one of {', '.join(LINKS)}, a bandwidth such as 25GB/s, or real"
        )
    return value


# Datasheet peaks, dense (no 2:4 sparsity). `float32` is the non-tensor-core (vector) rate;
# `bfloat16`/`float16` the dense tensor-core rate; `int8` dense tensor-core ops/s. Bandwidth and
# memory in decimal units as marketed (GB = 1e9). None where we are not sure of the number.
# `host_link_bytes_per_s`: the device's link to the host CPU, per direction (`LINKS`).
_TB = 1e12
_T = 1e12
_GB = 1e9

HARDWARE: dict[str, dict] = {
    # NVIDIA A100 datasheet (SXM4): 1,555 GB/s HBM2; FP32 19.5 TF, BF16/FP16 312 TF, INT8 624 TOPS.
    "A100-40GB": {
        "memory_bandwidth_bytes_per_s": 1.555 * _TB,
        "flops_per_s": {
            "float32": 19.5 * _T,
            "bfloat16": 312 * _T,
            "float16": 312 * _T,
            "int8": 624 * _T,
        },
        "memory_bytes": 40 * _GB,
        "interconnect": "NVLink 3, 600 GB/s",
        "host_link_bytes_per_s": _PCIE4_X16,
    },
    # NVIDIA A100 datasheet (80GB SXM4): 2,039 GB/s HBM2e; same compute as the 40GB.
    "A100-80GB": {
        "memory_bandwidth_bytes_per_s": 2.039 * _TB,
        "flops_per_s": {
            "float32": 19.5 * _T,
            "bfloat16": 312 * _T,
            "float16": 312 * _T,
            "int8": 624 * _T,
        },
        "memory_bytes": 80 * _GB,
        "interconnect": "NVLink 3, 600 GB/s",
        "host_link_bytes_per_s": _PCIE4_X16,
    },
    # NVIDIA H100 datasheet (SXM5): 3.35 TB/s; FP32 67 TF, BF16/FP16 989 TF, INT8 1,979 TOPS.
    "H100-SXM": {
        "memory_bandwidth_bytes_per_s": 3.35 * _TB,
        "flops_per_s": {
            "float32": 67 * _T,
            "bfloat16": 989 * _T,
            "float16": 989 * _T,
            "int8": 1979 * _T,
        },
        "memory_bytes": 80 * _GB,
        "interconnect": "NVLink 4, 900 GB/s",
        "host_link_bytes_per_s": _PCIE5_X16,
    },
    # NVIDIA H100 datasheet (PCIe): 2.0 TB/s; FP32 51 TF, BF16/FP16 756 TF, INT8 1,513 TOPS.
    "H100-PCIe": {
        "memory_bandwidth_bytes_per_s": 2.0 * _TB,
        "flops_per_s": {
            "float32": 51 * _T,
            "bfloat16": 756 * _T,
            "float16": 756 * _T,
            "int8": 1513 * _T,
        },
        "memory_bytes": 80 * _GB,
        "interconnect": "PCIe Gen5, 128 GB/s (NVLink bridge 600 GB/s)",
        "host_link_bytes_per_s": _PCIE5_X16,
    },
    # NVIDIA H200 datasheet (SXM): 4.8 TB/s HBM3e, 141 GB; compute as H100 SXM.
    "H200": {
        "memory_bandwidth_bytes_per_s": 4.8 * _TB,
        "flops_per_s": {
            "float32": 67 * _T,
            "bfloat16": 989 * _T,
            "float16": 989 * _T,
            "int8": 1979 * _T,
        },
        "memory_bytes": 141 * _GB,
        "interconnect": "NVLink 4, 900 GB/s",
        "host_link_bytes_per_s": _PCIE5_X16,
    },
    # NVIDIA HGX B200 datasheet, per GPU: 8 TB/s HBM3e; BF16/FP16 2.25 PF, INT8 4.5 POPS dense.
    # FP32 vector rate not stated there; 192 GB per the product brief (180 GB usable in DGX B200).
    "B200": {
        "memory_bandwidth_bytes_per_s": 8.0 * _TB,
        "flops_per_s": {
            "float32": None,
            "bfloat16": 2250 * _T,
            "float16": 2250 * _T,
            "int8": 4500 * _T,
        },
        "memory_bytes": 192 * _GB,
        "interconnect": "NVLink 5, 1.8 TB/s",
        "host_link_bytes_per_s": None,  # host link not stated in the HGX B200 datasheet
    },
    # NVIDIA L4 datasheet: 300 GB/s GDDR6, 24 GB; FP32 30.3 TF, BF16/FP16 121 TF, INT8 242.5 TOPS.
    "L4": {
        "memory_bandwidth_bytes_per_s": 0.3 * _TB,
        "flops_per_s": {
            "float32": 30.3 * _T,
            "bfloat16": 121 * _T,
            "float16": 121 * _T,
            "int8": 242.5 * _T,
        },
        "memory_bytes": 24 * _GB,
        "interconnect": "PCIe Gen4 x16, 64 GB/s",
        "host_link_bytes_per_s": _PCIE4_X16,
    },
    # NVIDIA L40S datasheet: 864 GB/s GDDR6, 48 GB; FP32 91.6 TF, BF16/FP16 362 TF, INT8 733 TOPS.
    "L40S": {
        "memory_bandwidth_bytes_per_s": 0.864 * _TB,
        "flops_per_s": {
            "float32": 91.6 * _T,
            "bfloat16": 362.05 * _T,
            "float16": 362.05 * _T,
            "int8": 733 * _T,
        },
        "memory_bytes": 48 * _GB,
        "interconnect": "PCIe Gen4 x16, 64 GB/s",
        "host_link_bytes_per_s": _PCIE4_X16,
    },
    # NVIDIA Ada whitepaper (RTX 4090): 1,008 GB/s GDDR6X, 24 GB; FP32 82.6 TF; BF16/FP16 tensor
    # with FP32 accumulate 165.2 TF (what frameworks use; 330 with FP16 accumulate); INT8 660.6.
    "RTX-4090": {
        "memory_bandwidth_bytes_per_s": 1.008 * _TB,
        "flops_per_s": {
            "float32": 82.6 * _T,
            "bfloat16": 165.2 * _T,
            "float16": 165.2 * _T,
            "int8": 660.6 * _T,
        },
        "memory_bytes": 24 * _GB,
        "interconnect": "PCIe Gen4 x16, 64 GB/s (no NVLink)",
        "host_link_bytes_per_s": _PCIE4_X16,
    },
    # AMD Instinct MI300X datasheet: 5.3 TB/s HBM3, 192 GB; FP32 vector 81.7 TF, BF16/FP16
    # 1,307.4 TF, INT8 2,614.9 TOPS dense.
    "MI300X": {
        "memory_bandwidth_bytes_per_s": 5.3 * _TB,
        "flops_per_s": {
            "float32": 81.7 * _T,
            "bfloat16": 1307.4 * _T,
            "float16": 1307.4 * _T,
            "int8": 2614.9 * _T,
        },
        "memory_bytes": 192 * _GB,
        "interconnect": "Infinity Fabric, 896 GB/s",
        "host_link_bytes_per_s": _PCIE5_X16,
    },
}


_ALIASES = {"h100": "h100-sxm", "a100": "a100-80gb", "4090": "rtx-4090"}


def datasheet(name: str) -> dict[str, Any] | None:
    """The `HARDWARE` entry for a name in any case, or a short alias (h100, a100, 4090)."""
    by_lower = {key.lower(): value for key, value in HARDWARE.items()}
    return by_lower.get(_ALIASES.get(name.lower(), name.lower()))


# What `torch.cuda.get_device_name()` says → HARDWARE key; the first match wins, so the
# more specific patterns come first. All words of a pattern must be in the name.
_DEVICE_NAMES = (
    ("h100 pcie", "H100-PCIe"),
    ("h100", "H100-SXM"),
    ("h200", "H200"),
    ("b200", "B200"),
    ("a100 40gb", "A100-40GB"),
    ("a100", "A100-80GB"),
    ("l40s", "L40S"),
    ("l4", "L4"),
    ("4090", "RTX-4090"),
    ("mi300x", "MI300X"),
)


def datasheet_name_of(device_name: str) -> str | None:
    """The datasheet entry of a device as the driver names it ("NVIDIA H100 80GB HBM3" →
    "H100-SXM"), or None (CPUs, unknown GPUs)."""
    words = device_name.lower().replace("-", " ").split()
    for pattern, key in _DEVICE_NAMES:
        if all(part in words for part in pattern.split()):
            return key
    return None
