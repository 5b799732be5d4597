"""llmbench.kernels.checks: the launcher checks' one-line errors."""

from __future__ import annotations

import pytest
import torch

from llmbench.kernels.checks import FLOAT_DTYPES, check_shape, check_tensor
from llmbench.kernels.errors import KernelArgumentError


def test_a_strided_leading_dim_passes_but_a_strided_inner_dim_does_not():
    qkv = torch.randn(5, 3, 2, 8)
    check_tensor("op", "kv", qkv[:, 1:], "[T, 2, nkv, d]", FLOAT_DTYPES, 3)  # rows strided
    with pytest.raises(KernelArgumentError, match=r"op: kv must be contiguous in its last 3 dims"):
        check_tensor("op", "kv", qkv[:, :, :1], "[T, 2, nkv, d]", FLOAT_DTYPES, 3)
    with pytest.raises(KernelArgumentError, match=r"pass x.contiguous\(\)$"):
        check_tensor("op", "x", torch.randn(8, 4).t(), "[T, h]", FLOAT_DTYPES)


def test_rank_dtype_device_and_shape_errors_name_the_argument():
    with pytest.raises(KernelArgumentError, match=r"op: x must be 2-D \[T, h\], got shape \(4,\)"):
        check_tensor("op", "x", torch.randn(4), "[T, h]", FLOAT_DTYPES)
    with pytest.raises(KernelArgumentError, match="op: x has dtype int32; pass float32 or float16"):
        check_tensor("op", "x", torch.zeros(2, 2, dtype=torch.int32), "[T, h]", FLOAT_DTYPES)
    with pytest.raises(KernelArgumentError, match="op: w is on cpu, the other tensors on meta"):
        check_tensor("op", "w", torch.randn(2), "[h]", FLOAT_DTYPES, device=torch.device("meta"))
    with pytest.raises(
        KernelArgumentError, match=r"op: w must have shape \[h\] = \(3,\), got \(2,\)"
    ):
        check_shape("op", "w", torch.randn(2), (3,), "[h]")
    with pytest.raises(KernelArgumentError, match="must be a torch.Tensor"):
        check_tensor("op", "x", [1.0], "[h]", FLOAT_DTYPES)
