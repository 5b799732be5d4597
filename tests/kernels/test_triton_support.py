"""llmbench.kernels.triton_support: lazy jitting, and whether a kernel can launch here."""

from __future__ import annotations

import pytest

from llmbench.kernels import triton_support
from llmbench.kernels.errors import KernelDispatchError
from llmbench.kernels.triton_support import check_launchable, next_power_of_2, triton_kernel


@pytest.mark.parametrize(("n", "expected"), [(1, 1), (2, 2), (3, 4), (64, 64), (65, 128), (0, 1)])
def test_next_power_of_2(n, expected):
    assert next_power_of_2(n) == expected


def test_a_kernel_is_not_jitted_until_its_first_launch():
    def _kernel(x_ptr):
        pass

    kernel = triton_kernel(_kernel)
    assert kernel.fn is _kernel
    assert kernel._jitted is None


def test_without_triton_a_launch_is_one_line_not_an_import_error(monkeypatch):
    monkeypatch.setattr(triton_support, "triton", None)
    kernel = triton_kernel(lambda x_ptr: None)
    with pytest.raises(KernelDispatchError, match="triton is not installed"):
        kernel[(1,)]
    with pytest.raises(KernelDispatchError, match="rms_norm: triton is not installed"):
        check_launchable("rms_norm", "cuda")


def test_cpu_tensors_need_the_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(KernelDispatchError, match="rope: tensors on cpu: .*TRITON_INTERPRET=1"):
        check_launchable("rope", "cpu")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    check_launchable("rope", "cpu")
    check_launchable("rope", "cuda")


def test_an_interpreter_switched_on_after_importing_triton_is_named(monkeypatch):
    """Triton jits its own library functions at import: set TRITON_INTERPRET after that and
    the interpreter fails deep inside; the launcher says what happened instead."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(triton_support, "_imported_interpreting", lambda: False)
    with pytest.raises(KernelDispatchError, match="rope: TRITON_INTERPRET=1 was set after triton"):
        check_launchable("rope", "cpu")
    check_launchable("rope", "cuda")
