"""Triton for the kernel modules: a lazily jitted kernel wrapper and the checks that it can run.

Only the kernel modules import this (and so Triton); `dispatch` decides without importing it.
That matters for the CPU interpreter: Triton reads TRITON_INTERPRET=1 when it is imported (its
own library functions are jitted then) and again when each kernel is jitted, so the variable
must be set before the first `import triton` in the process. Every kernel module defines its
kernels with `@triton_kernel` instead of `@triton.jit`: the wrapper jits on the first launch, so
a kernel module imports (and its torch reference runs) even without Triton installed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from llmbench.kernels.dispatch import is_interpreting
from llmbench.kernels.errors import KernelDispatchError

try:
    import triton
    import triton.language as tl
except ImportError:  # the `kernels` extra is not installed: torch references only
    triton = None
    tl = None


def next_power_of_2(n: int) -> int:
    """Smallest power of two >= n (>= 1): Triton tiles have power-of-two sizes."""
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def _unavailable(op: str) -> KernelDispatchError:
    return KernelDispatchError(
        f"{op}: triton is not installed; install llmbench[kernels] or use the torch reference"
    )


class TritonKernel:
    """A Triton kernel jitted (compiled, or interpreted) on its first `kernel[grid](...)`."""

    def __init__(self, fn: Callable[..., Any]):
        self.fn = fn
        self._jitted: Any = None

    def __getitem__(self, grid: tuple[int, ...]) -> Callable[..., Any]:
        if triton is None:
            raise _unavailable(self.fn.__name__)
        if self._jitted is None:
            self._jitted = triton.jit(self.fn)
        return self._jitted[grid]


def triton_kernel(fn: Callable[..., Any]) -> TritonKernel:
    """Decorator: the Triton kernel `fn`, jitted at its first launch (module docstring)."""
    return TritonKernel(fn)


def _imported_interpreting() -> bool:
    """Whether Triton was imported in interpreter mode: its library functions (tl.sum) are
    then interpreted functions, not compiled ones."""
    from triton.runtime.jit import JITFunction

    return not isinstance(tl.sum, JITFunction)


def check_launchable(op: str, device_type: str) -> None:
    """Raise unless a Triton kernel can run on tensors of `device_type` here."""
    if triton is None:
        raise _unavailable(op)
    if device_type == "cuda":
        return
    if not is_interpreting():
        raise KernelDispatchError(
            f"{op}: tensors on {device_type}: Triton kernels run on CUDA, or on the CPU with "
            "TRITON_INTERPRET=1 set before triton is imported"
        )
    if not _imported_interpreting():
        raise KernelDispatchError(
            f"{op}: TRITON_INTERPRET=1 was set after triton was imported; set it before the "
            "first import of triton (or of a llmbench.kernels kernel module)"
        )
