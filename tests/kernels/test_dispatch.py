"""llmbench.kernels.dispatch: which implementation each op uses per device and environment."""

from __future__ import annotations

import pytest

from llmbench.kernels import dispatch
from llmbench.kernels.dispatch import OPS, choose, is_interpreting, triton_version
from llmbench.kernels.errors import KernelDispatchError


@pytest.fixture
def with_triton(monkeypatch):
    monkeypatch.setattr(dispatch, "triton_version", lambda: "3.9.0")


@pytest.fixture
def without_triton(monkeypatch):
    monkeypatch.setattr(dispatch, "triton_version", lambda: None)


@pytest.mark.parametrize(
    ("value", "expected"), [("1", True), ("true", True), ("0", False), ("", False)]
)
def test_interpreter_switch_reads_triton_interpret(value, expected):
    assert is_interpreting({"TRITON_INTERPRET": value}) is expected
    assert is_interpreting({}) is False


def test_triton_version_is_read_without_importing_triton():
    version = triton_version()
    assert version is not None and version[0].isdigit()  # the test extra installs triton


def test_auto_picks_triton_on_cuda_and_torch_elsewhere(with_triton):
    cuda = choose("cuda", {})
    assert cuda.uses_triton and not cuda.is_interpreted
    assert all(cuda.implementation_of(op) == "triton" for op in OPS)
    assert cuda.describe(("rms_norm", "rope")) == (
        "triton 3.9.0 kernels (compiled for cuda): rms_norm, rope"
    )
    cpu = choose("cpu", {"TRITON_INTERPRET": "1"})  # the interpreter is for tests, never auto
    assert cpu.implementation_of("rope") == "torch"
    assert cpu.describe() == "torch reference ops (cpu: the Triton kernels are for CUDA)"


def test_cuda_without_triton_falls_back_to_torch_and_says_why(without_triton):
    assert choose("cuda", {}).describe() == "torch reference ops (cuda: triton is not installed)"


def test_override_torch_everywhere(with_triton):
    choice = choose("cuda", {"LLMBENCH_KERNELS": "torch"})
    assert not choice.uses_triton
    assert choice.describe() == "torch reference ops (LLMBENCH_KERNELS=torch)"


def test_override_triton_on_cpu_needs_the_interpreter(with_triton):
    with pytest.raises(KernelDispatchError, match="LLMBENCH_KERNELS=triton on cpu: .*TRITON_INT"):
        choose("cpu", {"LLMBENCH_KERNELS": "triton"})
    choice = choose("cpu", {"LLMBENCH_KERNELS": "triton", "TRITON_INTERPRET": "1"})
    assert choice.uses_triton and choice.is_interpreted
    assert choice.describe(("rope",)) == "triton 3.9.0 kernels (TRITON_INTERPRET=1 on cpu): rope"


def test_override_triton_without_triton_is_one_line(without_triton):
    with pytest.raises(KernelDispatchError, match=r"triton is not installed; pip install"):
        choose("cuda", {"LLMBENCH_KERNELS": "triton"})


def test_an_unknown_override_or_op_is_one_line(with_triton):
    with pytest.raises(KernelDispatchError, match="LLMBENCH_KERNELS=cutlass: unknown; use one"):
        choose("cuda", {"LLMBENCH_KERNELS": "cutlass"})
    with pytest.raises(KernelDispatchError, match="op 'gelu': unknown"):
        choose("cuda", {}).implementation_of("gelu")
