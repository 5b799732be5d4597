"""Launcher checks: a tensor's dtype, rank, shape, device and inner contiguity, one line each.

Every kernel launcher calls these before launching, so a wrong layout is a `KernelArgumentError`
naming the kernel, the argument and what to pass, instead of a wrong answer or a memory fault.
"""

from __future__ import annotations

import torch

from llmbench.kernels.errors import KernelArgumentError

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
CPU = torch.device("cpu")  # where the C++ extension's ops take their tensors
INDEX_DTYPES = (torch.int32, torch.int64)


def _names(dtypes: tuple[torch.dtype, ...]) -> str:
    return " or ".join(str(d).removeprefix("torch.") for d in dtypes)


def check_tensor(
    op: str,
    name: str,
    t: object,
    layout: str,
    dtypes: tuple[torch.dtype, ...],
    contiguous_dims: int = 1,
    device: torch.device | None = None,
) -> torch.Tensor:
    """`t` must be a tensor of rank len(layout dims), one of `dtypes`, on `device` (when
    given), and its last `contiguous_dims` dims contiguous (leading dims may be strided views).

    `layout` is the expected shape in words, e.g. "[T, nkv, d]".
    """
    if not isinstance(t, torch.Tensor):
        raise KernelArgumentError(f"{op}: {name} must be a torch.Tensor {layout}, got {type(t)}")
    ndim = len(layout.strip("[]").split(","))
    if t.dim() != ndim:
        raise KernelArgumentError(
            f"{op}: {name} must be {ndim}-D {layout}, got shape {tuple(t.shape)}"
        )
    if t.dtype not in dtypes:
        raise KernelArgumentError(
            f"{op}: {name} has dtype {str(t.dtype).removeprefix('torch.')}; pass {_names(dtypes)}"
        )
    if device is not None and t.device != device:
        raise KernelArgumentError(
            f"{op}: {name} is on {t.device}, the other tensors on {device}; move it there"
        )
    expected = 1
    for dim in range(t.dim() - 1, t.dim() - 1 - contiguous_dims, -1):
        if t.shape[dim] > 1 and t.stride(dim) != expected:
            inner = "its last dim" if contiguous_dims == 1 else f"its last {contiguous_dims} dims"
            raise KernelArgumentError(
                f"{op}: {name} must be contiguous in {inner} (shape {tuple(t.shape)}, strides "
                f"{t.stride()}); pass {name}.contiguous()"
            )
        expected *= t.shape[dim]
    return t


def check_shape(op: str, name: str, t: torch.Tensor, shape: tuple[int, ...], layout: str) -> None:
    """`t.shape` must equal `shape` (the dims `layout` names, resolved from other arguments)."""
    if tuple(t.shape) != tuple(shape):
        raise KernelArgumentError(
            f"{op}: {name} must have shape {layout} = {tuple(shape)}, got {tuple(t.shape)}"
        )


def check_same_dtype(op: str, name: str, t: torch.Tensor, other: str, dtype: torch.dtype) -> None:
    if t.dtype != dtype:
        raise KernelArgumentError(
            f"{op}: {name} has dtype {str(t.dtype).removeprefix('torch.')}, {other} "
            f"{str(dtype).removeprefix('torch.')}; pass both in one dtype"
        )


def check_bias_and_residual(
    op: str,
    x: torch.Tensor,
    out_features: int,
    bias: torch.Tensor | None,
    residual: torch.Tensor | None,
) -> None:
    """A matmul's optional adds to y [M, N] = x [M, K] @ W^T: bias [N] and residual [M, N], on
    x's device, in x's dtype, the last dim contiguous."""
    if bias is not None:
        check_tensor(op, "bias", bias, "[N]", (x.dtype,), device=x.device)
        check_shape(op, "bias", bias, (out_features,), "[N]")
    if residual is not None:
        check_tensor(op, "residual", residual, "[M, N]", (x.dtype,), device=x.device)
        check_shape(op, "residual", residual, (x.shape[0], out_features), "[M, N]")


def check_value(op: str, condition: bool, message: str) -> None:
    """A condition on sizes or scalars: `message` says what is wrong and what to pass."""
    if not condition:
        raise KernelArgumentError(f"{op}: {message}")


def check_paged_cache(
    op: str, q: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor
) -> None:
    """The paged K and V caches of an attention over q [.., nh, d]: each [S, nkv, d] on q's
    device, in q's dtype, with the inner [nkv, d] contiguous, nkv dividing nh; both one shape."""
    num_heads, head_dim = q.shape[-2:]
    for name, cache in (("key_cache", key_cache), ("value_cache", value_cache)):
        check_tensor(op, name, cache, "[S, nkv, d]", FLOAT_DTYPES, 2, q.device)
        check_same_dtype(op, name, cache, "q", q.dtype)
        check_value(
            op,
            cache.shape[2] == head_dim and cache.shape[1] > 0 and num_heads % cache.shape[1] == 0,
            f"{name} must be [S, nkv, d] with d = {head_dim} and nkv dividing nh = "
            f"{num_heads}, got {tuple(cache.shape)}",
        )
    check_shape(op, "value_cache", value_cache, tuple(key_cache.shape), "key_cache's shape")
