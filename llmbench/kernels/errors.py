"""The errors a kernel launcher raises: one line naming the argument and what to pass instead.

The kernels layer imports nothing from llmbench, so it cannot raise `llmbench.errors.UserError`;
the engine turns a `KernelDispatchError` (a bad environment override) into one.
"""


class KernelArgumentError(ValueError):
    """A tensor handed to a kernel has the wrong layout, dtype, shape or device."""


class KernelDispatchError(ValueError):
    """The requested kernel implementation cannot run here (e.g. Triton on a CPU)."""
