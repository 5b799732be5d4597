"""What this CPU is: its name and feature flags, from /proc/cpuinfo (the one reader of it).

The C++ extension picks its instruction set from the flags (`cpu_extension`), the bfloat16
matmuls their products' dtype (`multiplies_in_float32`); provenance and
the measured roofs name the device by the model name. Where /proc/cpuinfo cannot be read (macOS,
a sandbox) the name falls back to `platform` and the flags are empty. Imports no torch: the
roof probes and provenance read it before torch is loaded.
"""

from __future__ import annotations

import platform
from pathlib import Path

CPUINFO = Path("/proc/cpuinfo")


def cpu_flags(cpuinfo: str) -> frozenset[str]:
    """The feature flags of the first processor in a /proc/cpuinfo text."""
    return frozenset(_field(cpuinfo, "flags").split())


def cpu_model_name(cpuinfo: str) -> str | None:
    """The `model name` of the first processor in a /proc/cpuinfo text (None: not there)."""
    return _field(cpuinfo, "model name") or None


def this_cpu_flags() -> frozenset[str]:
    """This machine's CPU flags (empty where /proc/cpuinfo is not readable)."""
    return cpu_flags(_read())


def has_native_bf16(flags: frozenset[str]) -> bool:
    """Whether a CPU with `flags` multiplies bfloat16 in hardware (AVX-512 BF16 or AMX BF16),
    which torch's bfloat16 matmul needs to be fast. Without: on a 2-core AMD EPYC with AVX2
    only (2026-11-28) torch's bfloat16 matmul ran at 16-20 GFLOP/s at every size where float32
    ran at 137 (x [2048, 576] @ W [3072, 576]^T), and a 512x512 one at 1.3."""
    return "avx512_bf16" in flags or "amx_bf16" in flags


def multiplies_in_float32(dtype: str, device_type: str, flags: frozenset[str]) -> bool:
    """Whether `dtype` (torch's name: "bfloat16") is multiplied in float32 on `device_type`:
    bfloat16 on a CPU without bfloat16 products (`has_native_bf16`). The one rule for the
    engine's float and int8 layers (`engine.linear.Linear`, `quant.linear.int8_layer`) and the
    roof probe that times them (`roofline.ceilings`)."""
    return dtype == "bfloat16" and device_type == "cpu" and not has_native_bf16(flags)


def cpu_name() -> str:
    """This machine's CPU model ("Intel(R) Xeon(R) Processor"), else what `platform` knows."""
    return cpu_model_name(_read()) or platform.processor() or platform.machine()


def _field(cpuinfo: str, name: str) -> str:
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() == name:
            return value.strip()
    return ""


def _read() -> str:
    try:
        return CPUINFO.read_text()
    except OSError:
        return ""
