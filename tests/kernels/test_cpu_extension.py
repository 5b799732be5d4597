"""The CPU C++ extension (`kernels.cpu_extension`): the instruction set and flags it is built
with, its name and cache, how a build is recorded and announced, how it is loaded, the torch
fallback when it cannot be built, and the environment variables that force either path.

The extension is built once per machine into the llmbench cache (the first session pays
~20-45 s; later ones load the cached library), through `cpu_extension.default()` as the engine
does (the `backend` fixture); every other test here builds nothing."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys

import pytest
from torch.utils import cpp_extension

from llmbench.kernels import cpu_extension
from llmbench.kernels.dispatch import Dispatch
from llmbench.kernels.errors import KernelDispatchError

AVX512_BF16_FLAGS = frozenset(
    "fpu sse2 avx2 fma f16c avx512f avx512bw avx512vl avx512_bf16 avx512_vnni".split()
)


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
    chosen, cflags = cpu_extension.choose_isa(flags)
    assert chosen == isa
    assert (must_have in cflags) if must_have else cflags == ()


def test_a_wanted_instruction_set_is_built_if_the_cpu_runs_it():
    amx = AVX512_BF16_FLAGS | {"amx_tile", "amx_bf16"}
    assert cpu_extension.choose_isa(amx)[0] == "avx512bf16_vnni_amx"
    assert cpu_extension.choose_isa(amx, "avx512bf16_vnni") == cpu_extension.choose_isa(
        AVX512_BF16_FLAGS
    )
    assert cpu_extension.choose_isa(amx, "scalar") == ("scalar", ())
    assert cpu_extension.runnable_isas(frozenset({"avx2", "fma", "f16c"})) == ["avx2", "scalar"]
    with pytest.raises(KernelDispatchError) as lacking:
        cpu_extension.choose_isa(AVX512_BF16_FLAGS, "avx512bf16_vnni_amx")
    assert str(lacking.value) == (
        "LLMBENCH_CPU_ISA=avx512bf16_vnni_amx: this CPU lacks amx_tile, amx_bf16; it runs "
        "avx512bf16_vnni, avx512_vnni, avx512bf16, avx512, avx2, scalar"
    )
    with pytest.raises(KernelDispatchError, match=r"=sse9: unknown instruction set; use one of"):
        cpu_extension.choose_isa(amx, "sse9")


def test_the_wanted_instruction_set_is_read_from_the_environment(tmp_path):
    assert cpu_extension.wanted_isa({"LLMBENCH_CPU_ISA": " AVX2 "}) == "avx2"
    assert cpu_extension.wanted_isa({"LLMBENCH_CPU_ISA": ""}) is None
    env = {"LLMBENCH_CPU_ISA": "avx512bf16_vnni_amx"}
    with pytest.raises(KernelDispatchError, match="this CPU lacks amx_tile"):
        cpu_extension.load(tmp_path, env=env, flags=AVX512_BF16_FLAGS)


def test_build_name_changes_with_source_flags_and_torch():
    base = cpu_extension.build_name(b"src", "avx2", ("-mavx2",), "2.13.0")
    assert base.startswith("llmbench_cpu_ext_avx2_")
    assert base == cpu_extension.build_name(b"src", "avx2", ("-mavx2",), "2.13.0")
    assert base != cpu_extension.build_name(b"src2", "avx2", ("-mavx2",), "2.13.0")
    assert base != cpu_extension.build_name(b"src", "avx2", ("-mavx2", "-O3"), "2.13.0")
    assert base != cpu_extension.build_name(b"src", "avx2", ("-mavx2",), "2.14.0")


def test_cache_dir_follows_llmbench_cache(tmp_path):
    env = {"LLMBENCH_CACHE": str(tmp_path)}
    assert cpu_extension.cache_dir(env) == tmp_path / "cpp_extensions"


def test_build_is_recorded_and_a_second_load_does_not_rebuild(backend, monkeypatch):
    build_dir = cpu_extension.cache_dir() / backend.namespace
    record = json.loads((build_dir / "build.json").read_text())
    assert record["build_s"] == backend.build_s and record["isa"] == backend.isa
    assert (build_dir / f"{backend.namespace}.so").is_file()

    def no_build(*args):
        raise AssertionError("rebuilt a cached extension")

    monkeypatch.setattr(cpu_extension, "_build", no_build)
    again = cpu_extension.load()
    assert again.is_extension and again.is_cached and again.namespace == backend.namespace


def test_a_new_process_loads_the_cached_build_without_a_compiler(backend):
    code = "from llmbench.kernels import cpu_extension; print(cpu_extension.load().describe())"
    env = {**os.environ, "CXX": "/nonexistent/c++", "LLMBENCH_CPU_EXTENSION": "auto"}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    built = f"built in {backend.build_s:.1f} s"
    assert out.stdout.strip() == f"C++ extension ({backend.isa}; {built}, cached)"
    assert "compiling" not in out.stderr


def test_without_a_compiler_it_falls_back_to_torch(tmp_path):
    result = cpu_extension.load(tmp_path, env={"CXX": str(tmp_path / "no-such-c++")})
    assert not result.is_extension
    assert result.reason == f"no C++ compiler ({tmp_path / 'no-such-c++'} not found)"
    assert result.describe() == f"torch matmul ({result.reason})"
    assert list(tmp_path.iterdir()) == []  # nothing half-built left behind


def test_without_ninja_it_falls_back_to_torch(tmp_path, monkeypatch):
    monkeypatch.setattr(cpp_extension, "is_ninja_available", lambda: False)
    result = cpu_extension.load(tmp_path, env={})
    assert result.describe() == "torch matmul (ninja not found (pip install ninja))"


def test_a_failed_build_falls_back_with_its_first_line(tmp_path, monkeypatch, capsys):
    def failing_build(name, cflags, directory):
        raise RuntimeError("Error building extension 'x'\ng++: fatal error: no input files")

    monkeypatch.setattr(cpu_extension, "_LOADED", {})
    monkeypatch.setattr(cpu_extension, "_build", failing_build)
    result = cpu_extension.load(tmp_path, env={}, flags=frozenset())
    assert not result.is_extension
    assert result.reason == "build failed: Error building extension 'x'"
    # The compile was announced with its estimate (no build recorded under tmp_path).
    assert capsys.readouterr().err == cpu_extension.compile_notice("scalar", tmp_path) + "\n"


def test_the_compile_notice_quotes_the_last_build_recorded_here(tmp_path):
    assert cpu_extension.compile_notice("avx2", tmp_path) == (
        "llmbench: compiling the CPU C++ extension (avx2), once per machine: "
        "about a minute on 2 cores..."
    )
    records = [  # an older build under the library's earlier name, a newer one, a failed one
        (
            "llmbench_cpu_gemv_avx2_000000000000",
            {"build_s": 23.26, "built_at": "2026-11-20T10:00:00"},
        ),
        (
            "llmbench_cpu_ext_avx2_111111111111",
            {"build_s": 41.6, "built_at": "2026-11-26T14:06:15"},
        ),
        ("llmbench_cpu_ext_avx2_222222222222", None),
    ]
    for name, record in records:
        (tmp_path / name).mkdir()
        if record is not None:
            (tmp_path / name / "build.json").write_text(json.dumps({**record, "isa": "avx2"}))
    assert cpu_extension.last_build_s(tmp_path) == 41.6
    assert cpu_extension.compile_notice("avx512bf16_vnni", tmp_path) == (
        "llmbench: compiling the CPU C++ extension (avx512bf16_vnni), once per machine: "
        "the last build here took 42 s..."
    )


def test_environment_forces_either_path(tmp_path):
    no_compiler = {"CXX": str(tmp_path / "none")}
    assert cpu_extension.load(tmp_path, env={cpu_extension.ENV_VAR: "torch"}).reason == (
        "LLMBENCH_CPU_EXTENSION=torch"
    )
    with pytest.raises(
        KernelDispatchError, match="LLMBENCH_CPU_EXTENSION=ext: no C\\+\\+ compiler"
    ):
        cpu_extension.load(tmp_path, env={cpu_extension.ENV_VAR: "ext", **no_compiler})
    with pytest.raises(KernelDispatchError, match="LLMBENCH_CPU_EXTENSION=fast: unknown"):
        cpu_extension.load(tmp_path, env={cpu_extension.ENV_VAR: "fast"})


def test_the_old_variable_name_still_works_and_says_once_that_it_is_deprecated(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.delenv(cpu_extension.ENV_VAR, raising=False)
    monkeypatch.setenv("LLMBENCH_CPU_GEMV", "torch")
    # A fresh once-per-process memory for the note (another test may have printed it).
    note = functools.cache(cpu_extension._note_deprecated_name.__wrapped__)
    monkeypatch.setattr(cpu_extension, "_note_deprecated_name", note)
    assert cpu_extension.load(tmp_path).reason == "LLMBENCH_CPU_GEMV=torch"
    assert cpu_extension.load(tmp_path).reason == "LLMBENCH_CPU_GEMV=torch"
    assert capsys.readouterr().err == (
        "llmbench: LLMBENCH_CPU_GEMV is deprecated; set LLMBENCH_CPU_EXTENSION instead "
        "(same values)\n"
    )
    monkeypatch.setenv("LLMBENCH_CPU_EXTENSION", "fast")  # the new name wins when both are set
    with pytest.raises(KernelDispatchError, match="LLMBENCH_CPU_EXTENSION=fast: unknown"):
        cpu_extension.load(tmp_path)
    assert capsys.readouterr().err == ""


def test_describe_for_provenance():
    built = cpu_extension.CpuExtension("extension", "loaded", "avx2", "ns", 12.34, is_cached=True)
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
        cpu_extension.CpuExtension("torch", "LLMBENCH_CPU_EXTENSION=torch").op("gemv")


def test_a_build_another_process_recorded_first_keeps_its_record(tmp_path, monkeypatch):
    """Workers that start on an empty cache together all call the builder (torch's lock lets
    one compile); the record written first stands, and each reports its build time."""
    monkeypatch.setattr(cpu_extension, "_LOADED", {})

    def build_of_another_process(name, cflags, build_dir):
        build_dir.mkdir(parents=True)
        (build_dir / "build.json").write_text(json.dumps({"build_s": 12.5, "isa": "x"}))

    monkeypatch.setattr(cpu_extension, "_build", build_of_another_process)
    result = cpu_extension.load(tmp_path, env={"LLMBENCH_CPU_EXTENSION": "auto"})
    assert result.reason == "built" and result.build_s == 12.5
    (build_dir,) = tmp_path.iterdir()
    assert [p.name for p in build_dir.iterdir()] == ["build.json"]  # no draft left
    assert json.loads((build_dir / "build.json").read_text()) == {"build_s": 12.5, "isa": "x"}
