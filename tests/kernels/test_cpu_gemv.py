"""The CPU 16-bit matmul extension: against the float32 reference, its checks, its cost, how it
is built, cached and loaded, and the torch fallback when it cannot be built.

The extension is built once per machine into the llmbench cache (the first session pays ~10-40 s;
later ones load the cached library), through `cpu_gemv.default()` as the engine does."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from torch.utils import cpp_extension

from llmbench.kernels import cpu_gemv, cpu_info
from llmbench.kernels.cost import KernelCost
from llmbench.kernels.dispatch import Dispatch
from llmbench.kernels.errors import KernelArgumentError, KernelDispatchError

AVX512_BF16_FLAGS = frozenset(
    "fpu sse2 avx2 fma f16c avx512f avx512bw avx512vl avx512_bf16 avx512_vnni".split()
)


def _random(shape, dtype, seed):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("num_rows", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("out_features, in_features", [(960, 576), (7, 33), (13, 100), (5, 1536)])
@pytest.mark.parametrize("adds", ["none", "bias", "residual", "both"])
def test_matches_float32_reference(backend, dtype, num_rows, out_features, in_features, adds):
    x = _random((num_rows, in_features), dtype, 1)
    weight = _random((out_features, in_features), dtype, 2)
    bias = _random((out_features,), dtype, 3) if adds in ("bias", "both") else None
    residual = _random((num_rows, out_features), dtype, 4) if adds in ("residual", "both") else None
    y = cpu_gemv.gemv(backend, x, weight, bias, residual)
    expected = cpu_gemv.gemv_reference(x, weight, bias, residual)
    assert y.dtype == dtype and y.shape == (num_rows, out_features)
    # Both sum in float32 and round once: they differ by the summation order only, at most
    # about one unit in the last place of the 16-bit result (float32: a few units of the sum's).
    ulp = {torch.bfloat16: 2**-7, torch.float16: 2**-10, torch.float32: 2**-16}[dtype]
    torch.testing.assert_close(y.float(), expected.float(), rtol=ulp, atol=ulp * in_features**0.5)


def test_matches_torch_bfloat16_addmm(backend):
    x = _random((1, 1536), torch.bfloat16, 5)
    weight = _random((576, 1536), torch.bfloat16, 6)  # down_proj of SmolLM2-135M
    residual = _random((1, 576), torch.bfloat16, 7)
    y = cpu_gemv.gemv(backend, x, weight, None, residual)
    torch.testing.assert_close(y, torch.addmm(residual, x, weight.t()), rtol=1.6e-2, atol=0.25)


def test_strided_rows_of_x_are_read_in_place(backend):
    wide = _random((3, 200), torch.bfloat16, 8)
    x = wide[:, :100]  # row stride 200
    weight = _random((9, 100), torch.bfloat16, 9)
    torch.testing.assert_close(
        cpu_gemv.gemv(backend, x, weight), cpu_gemv.gemv_reference(x.contiguous(), weight)
    )


def test_launcher_rejects_wrong_layouts(backend):
    x = torch.randn(1, 64).bfloat16()
    weight = torch.randn(32, 64).bfloat16()
    with pytest.raises(KernelArgumentError, match="weight has dtype float64"):
        cpu_gemv.gemv(backend, x.double(), weight.double())
    with pytest.raises(KernelArgumentError, match="x has dtype float16, weight bfloat16"):
        cpu_gemv.gemv(backend, x.half(), weight)
    with pytest.raises(KernelArgumentError, match="weight must be contiguous"):
        cpu_gemv.gemv(backend, x, torch.randn(64, 32).bfloat16().t())
    with pytest.raises(KernelArgumentError, match=r"x must have shape \[M, K\] = \(1, 64\)"):
        cpu_gemv.gemv(backend, torch.randn(1, 65).bfloat16(), weight)
    with pytest.raises(KernelArgumentError, match=r"bias must have shape \[N\] = \(32,\)"):
        cpu_gemv.gemv(backend, x, weight, bias=torch.randn(31).bfloat16())
    with pytest.raises(KernelArgumentError, match=r"residual must have shape \[M, N\]"):
        cpu_gemv.gemv(backend, x, weight, residual=torch.randn(2, 32).bfloat16())


def test_cost_is_a_hand_count():
    # qkv of SmolLM2-135M with a bias, one row, the residual added: bfloat16, 2 bytes each.
    cost = cpu_gemv.gemv_cost(1, 960, 576, "bfloat16", has_bias=True, has_residual=True)
    weights, x, y, bias, residual = 960 * 576, 576, 960, 960, 960
    assert cost == KernelCost(2 * (weights + x + y + bias + residual), 2 * 960 * 576 + 960 + 960)
    assert cpu_gemv.gemv_cost(4, 576, 1536, torch.float16) == KernelCost(
        2 * (576 * 1536 + 4 * 1536 + 4 * 576), 2 * 4 * 576 * 1536
    )


def test_cpu_flags_come_from_the_first_flags_line():
    cpuinfo = "processor\t: 0\nflags\t\t: fpu avx2 fma\nbugs\t\t: x\nflags\t\t: sse\n"
    assert cpu_info.cpu_flags(cpuinfo) == {"fpu", "avx2", "fma"}
    assert cpu_info.cpu_flags("processor : 0\n") == frozenset()


@pytest.mark.parametrize(
    "flags, isa, must_have",
    [
        (AVX512_BF16_FLAGS, "avx512bf16_vnni", "-mavx512vnni"),
        (AVX512_BF16_FLAGS - {"avx512_vnni"}, "avx512bf16", "-mavx512bf16"),
        (AVX512_BF16_FLAGS - {"avx512_bf16"}, "avx512_vnni", "-mavx512vnni"),
        (AVX512_BF16_FLAGS - {"avx512_bf16", "avx512_vnni"}, "avx512", "-mavx512f"),
        (frozenset({"avx2", "fma", "f16c"}), "avx2", "-mavx2"),
        (frozenset({"avx2", "fma"}), "scalar", None),  # no F16C: no vector half conversion
        (frozenset(), "scalar", None),
    ],
)
def test_isa_and_compiler_flags_follow_the_cpu(flags, isa, must_have):
    chosen, cflags = cpu_gemv.choose_isa(flags)
    assert chosen == isa
    assert (must_have in cflags) if must_have else cflags == ()


def test_build_name_changes_with_source_flags_and_torch():
    base = cpu_gemv.build_name(b"src", "avx2", ("-mavx2",), "2.13.0")
    assert base.startswith("llmbench_cpu_gemv_avx2_")
    assert base == cpu_gemv.build_name(b"src", "avx2", ("-mavx2",), "2.13.0")
    assert base != cpu_gemv.build_name(b"src2", "avx2", ("-mavx2",), "2.13.0")
    assert base != cpu_gemv.build_name(b"src", "avx2", ("-mavx2", "-O3"), "2.13.0")
    assert base != cpu_gemv.build_name(b"src", "avx2", ("-mavx2",), "2.14.0")


def test_cache_dir_follows_llmbench_cache(tmp_path):
    env = {"LLMBENCH_CACHE": str(tmp_path)}
    assert cpu_gemv.cache_dir(env) == tmp_path / "cpp_extensions"


def test_build_is_recorded_and_a_second_load_does_not_rebuild(backend, monkeypatch):
    build_dir = cpu_gemv.cache_dir() / backend.namespace
    record = json.loads((build_dir / "build.json").read_text())
    assert record["build_s"] == backend.build_s and record["isa"] == backend.isa
    assert (build_dir / f"{backend.namespace}.so").is_file()

    def no_build(*args):
        raise AssertionError("rebuilt a cached extension")

    monkeypatch.setattr(cpu_gemv, "_build", no_build)
    again = cpu_gemv.load()
    assert again.is_extension and again.is_cached and again.namespace == backend.namespace


def test_a_new_process_loads_the_cached_build_without_a_compiler(backend):
    code = "from llmbench.kernels import cpu_gemv; print(cpu_gemv.load().describe())"
    env = {**os.environ, "CXX": "/nonexistent/c++", "LLMBENCH_CPU_GEMV": "auto"}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    built = f"built in {backend.build_s:.1f} s"
    assert out.stdout.strip() == f"C++ extension ({backend.isa}; {built}, cached)"
    assert "compiling" not in out.stderr


def test_without_a_compiler_it_falls_back_to_torch(tmp_path):
    result = cpu_gemv.load(tmp_path, env={"CXX": str(tmp_path / "no-such-c++")})
    assert not result.is_extension
    assert result.reason == f"no C++ compiler ({tmp_path / 'no-such-c++'} not found)"
    assert result.describe() == f"torch matmul ({result.reason})"
    assert list(tmp_path.iterdir()) == []  # nothing half-built left behind


def test_without_ninja_it_falls_back_to_torch(tmp_path, monkeypatch):
    monkeypatch.setattr(cpp_extension, "is_ninja_available", lambda: False)
    result = cpu_gemv.load(tmp_path, env={})
    assert result.describe() == "torch matmul (ninja not found (pip install ninja))"


def test_a_failed_build_falls_back_with_its_first_line(tmp_path, monkeypatch):
    def failing_build(name, cflags, directory):
        raise RuntimeError("Error building extension 'x'\ng++: fatal error: no input files")

    monkeypatch.setattr(cpu_gemv, "_LOADED", {})
    monkeypatch.setattr(cpu_gemv, "_build", failing_build)
    result = cpu_gemv.load(tmp_path, env={})
    assert not result.is_extension
    assert result.reason == "build failed: Error building extension 'x'"


def test_environment_forces_either_path(tmp_path):
    no_compiler = {"CXX": str(tmp_path / "none")}
    assert cpu_gemv.load(tmp_path, env={cpu_gemv.ENV_VAR: "torch"}).reason == (
        "LLMBENCH_CPU_GEMV=torch"
    )
    with pytest.raises(KernelDispatchError, match="LLMBENCH_CPU_GEMV=ext: no C\\+\\+ compiler"):
        cpu_gemv.load(tmp_path, env={cpu_gemv.ENV_VAR: "ext", **no_compiler})
    with pytest.raises(KernelDispatchError, match="LLMBENCH_CPU_GEMV=fast: unknown"):
        cpu_gemv.load(tmp_path, env={cpu_gemv.ENV_VAR: "fast"})


def test_describe_for_provenance():
    built = cpu_gemv.CpuGemv("extension", "loaded", "avx2", "ns", 12.34, is_cached=True)
    assert built.describe() == "C++ extension (avx2; built in 12.3 s, cached)"
    dispatch = Dispatch("cpu", "torch", "cpu: the Triton kernels are for CUDA")
    assert dispatch.describe() == "torch reference ops (cpu: the Triton kernels are for CUDA)"
    with_extension = Dispatch(
        "cpu", "torch", "cpu", cpu_extension=built.describe(), cpu_extension_ops=("a", "b")
    )
    assert with_extension.describe() == (
        "torch reference ops (cpu); C++ extension (avx2; built in 12.3 s, cached): a, b"
    )
    with pytest.raises(KernelDispatchError, match="not in use"):
        cpu_gemv.CpuGemv("torch", "LLMBENCH_CPU_GEMV=torch").op()


def test_max_rows_per_dtype():
    assert cpu_gemv.max_rows(torch.bfloat16) == cpu_gemv.MAX_ROWS_BF16
    assert cpu_gemv.max_rows(torch.float16) == cpu_gemv.MAX_ROWS_F16
    assert cpu_gemv.max_rows(torch.float32) == cpu_gemv.MAX_ROWS_F32
