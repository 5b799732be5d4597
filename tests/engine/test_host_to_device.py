"""llmbench.engine.host_to_device: host lists arrive as the same tensor on the device."""

from __future__ import annotations

import pytest
import torch

from llmbench.engine.host_to_device import to_device


def test_on_a_cpu_it_is_torch_tensor():
    out = to_device([[1, 2], [3, 4]], torch.device("cpu"), torch.int32)
    assert out.dtype == torch.int32 and out.tolist() == [[1, 2], [3, 4]]
    assert to_device([0.5, 2.0], torch.device("cpu")).dtype == torch.float32  # as torch infers
    assert to_device([7, 8], torch.device("cpu")).dtype == torch.int64


@pytest.mark.gpu
def test_on_cuda_the_copy_is_queued_and_lands_before_the_next_kernel():
    device = torch.device("cuda")
    values = list(range(100_000))
    out = to_device(values, device, torch.int64)
    assert out.device.type == "cuda"
    assert (out * 2).sum().item() == 2 * sum(values)  # a kernel on the same stream sees it
