"""What one kernel launch moves and computes: `KernelCost`, and element sizes by dtype name.

Torch-free, so the roofline code can size kernels without the engine. Dtypes are given by name
(`"float16"`) or as a torch dtype (its `str` is `"torch.float16"`): both resolve the same way.
"""

from __future__ import annotations

from dataclasses import dataclass

# Bytes per element of each storage dtype; int4 packs two codes in a byte.
DTYPE_BYTES = {
    "float32": 4.0,
    "float16": 2.0,
    "bfloat16": 2.0,
    "int64": 8.0,
    "int32": 4.0,
    "int8": 1.0,
    "uint8": 1.0,
    "int4": 0.5,
}


@dataclass(frozen=True)
class KernelCost:
    """Bytes moved to and from memory and FLOPs of one launch (a fused pair: of both)."""

    bytes: int
    flops: int

    def __add__(self, other: KernelCost) -> KernelCost:
        return KernelCost(self.bytes + other.bytes, self.flops + other.flops)


def dtype_bytes(dtype: object) -> float:
    """Bytes per element of `dtype` (a name of DTYPE_BYTES or a torch dtype)."""
    name = str(dtype).removeprefix("torch.")
    if name not in DTYPE_BYTES:
        raise ValueError(f"dtype {name}: unknown; use one of {', '.join(DTYPE_BYTES)}")
    return DTYPE_BYTES[name]
