"""llmbench.kernels.cost: KernelCost and element sizes by dtype name or torch dtype."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from llmbench.kernels.cost import KernelCost, dtype_bytes


def test_dtype_bytes_by_name_and_by_torch_dtype():
    assert dtype_bytes("float32") == 4
    assert dtype_bytes(torch.float16) == 2
    assert dtype_bytes(torch.bfloat16) == 2
    assert dtype_bytes("int4") == 0.5  # two codes per byte


def test_an_unknown_dtype_is_one_line_naming_it():
    with pytest.raises(ValueError, match="dtype complex64: unknown"):
        dtype_bytes(torch.complex64)


def test_costs_add_and_are_frozen():
    total = KernelCost(bytes=10, flops=3) + KernelCost(bytes=5, flops=4)
    assert total == KernelCost(15, 7)
    with pytest.raises(dataclasses.FrozenInstanceError):
        total.bytes = 0
