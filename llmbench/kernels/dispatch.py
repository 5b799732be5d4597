"""Which implementation each kernel op uses on a device: the one place that decides.

    auto (default)  CUDA with Triton importable → "triton"; anything else → "torch" (reference)
    LLMBENCH_KERNELS=torch   the torch references everywhere
    LLMBENCH_KERNELS=triton  the Triton kernels; on a CPU only under TRITON_INTERPRET=1 (Triton's
                             numpy interpreter: slow, for tests)

`Dispatch.describe()` is the line a run records in its provenance (`device.kernels`). Deciding
never imports Triton (see `triton_support` for why that matters on a CPU).
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import metadata

from llmbench.kernels.errors import KernelDispatchError

ENV_VAR = "LLMBENCH_KERNELS"
CHOICES = ("auto", "triton", "torch")
# Every op of the kernels layer, one per kernel launcher.
OPS = (
    "rms_norm",
    "rope",
    "silu_and_mul",
    "kv_cache_write",
    "paged_decode_attention",
    "chunked_prefill_attention",
    "kv_quantize",
    "kv_dequantize",
)


def is_interpreting(env: Mapping[str, str] | None = None) -> bool:
    """Whether Triton runs kernels in its CPU interpreter (TRITON_INTERPRET set and true)."""
    value = (os.environ if env is None else env).get("TRITON_INTERPRET", "0")
    return value.strip().lower() in ("1", "true", "on", "yes")


def triton_version() -> str | None:
    """The installed Triton's version (None when it is not installed), without importing it."""
    if importlib.util.find_spec("triton") is None:
        return None
    try:
        return metadata.version("triton")
    except metadata.PackageNotFoundError:
        return None


@dataclass(frozen=True)
class Dispatch:
    """The implementation ("triton" or "torch") every op uses on `device_type`, and why."""

    device_type: str
    implementation: str
    reason: str
    triton_version: str | None = None
    is_interpreted: bool = False
    # CPU: the C++ extension in use (`cpu_extension.CpuExtension.describe()`, or why not), or
    # None, and the ops it runs there.
    cpu_extension: str | None = None
    cpu_extension_ops: tuple[str, ...] = ()

    @property
    def uses_triton(self) -> bool:
        return self.implementation == "triton"

    def implementation_of(self, op: str) -> str:
        if op not in OPS:
            raise KernelDispatchError(f"op {op!r}: unknown; the kernels layer has {', '.join(OPS)}")
        return self.implementation

    def describe(self, ops: tuple[str, ...] = OPS) -> str:
        """One line: which implementation runs `ops`, e.g. "triton 3.2.0 kernels (compiled for
        cuda): rms_norm, rope, ..." or "torch reference ops (cpu: ...)"."""
        if not self.uses_triton:
            ops = f": {', '.join(self.cpu_extension_ops)}" if self.cpu_extension_ops else ""
            extension = f"; {self.cpu_extension}{ops}" if self.cpu_extension else ""
            return f"torch reference ops ({self.reason}){extension}"
        how = "TRITON_INTERPRET=1 on " if self.is_interpreted else "compiled for "
        return f"triton {self.triton_version} kernels ({how}{self.device_type}): {', '.join(ops)}"


def choose(device_type: str, env: Mapping[str, str] | None = None) -> Dispatch:
    """The dispatch for tensors on `device_type` ("cuda", "cpu", ...) under `env` (default:
    the process environment)."""
    env = os.environ if env is None else env
    choice = env.get(ENV_VAR, "auto").strip().lower() or "auto"
    if choice not in CHOICES:
        raise KernelDispatchError(f"{ENV_VAR}={choice}: unknown; use one of {', '.join(CHOICES)}")
    version = triton_version()
    if choice == "torch":
        return Dispatch(device_type, "torch", f"{ENV_VAR}=torch")
    is_interpreted = device_type != "cuda" and is_interpreting(env)
    if choice == "triton":
        if version is None:
            raise KernelDispatchError(
                f"{ENV_VAR}=triton: triton is not installed; pip install 'llmbench[kernels]'"
            )
        if device_type != "cuda" and not is_interpreted:
            raise KernelDispatchError(
                f"{ENV_VAR}=triton on {device_type}: Triton kernels run on CUDA; set "
                "TRITON_INTERPRET=1 as well to run them in Triton's (slow) CPU interpreter"
            )
        return Dispatch(device_type, "triton", f"{ENV_VAR}=triton", version, is_interpreted)
    if device_type != "cuda":
        return Dispatch(device_type, "torch", f"{device_type}: the Triton kernels are for CUDA")
    if version is None:
        return Dispatch(device_type, "torch", "cuda: triton is not installed")
    return Dispatch(device_type, "triton", "cuda with triton", version)
