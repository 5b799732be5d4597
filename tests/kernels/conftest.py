"""Kernel tests run the Triton kernels on CUDA when there is one, else in Triton's CPU
interpreter (TRITON_INTERPRET=1, set by tests/conftest.py before anything can import Triton).
Tests marked `gpu` need a compiled GPU and are left out without one (tests/conftest.py); every
other test runs everywhere. `backend` is the CPU C++ extension the cpu_* tests call."""

from __future__ import annotations

import pytest
import torch

from llmbench.kernels import cpu_extension

HAS_CUDA = torch.cuda.is_available()


@pytest.fixture
def device() -> torch.device:
    """Where the kernels under test run: the GPU, or the CPU through the interpreter."""
    return torch.device("cuda" if HAS_CUDA else "cpu")


@pytest.fixture(scope="module")
def backend() -> cpu_extension.CpuExtension:
    """The CPU C++ extension, built or loaded as the engine loads it (`cpu_extension.default()`)."""
    result = cpu_extension.default()
    assert result.is_extension, result.reason
    return result
