"""Tests for benchmarks/llama_cpp_build.py: llama.cpp's CMake options for the three CPU kinds
seen here, from their /proc/cpuinfo flags."""

from __future__ import annotations

from benchmarks.llama_cpp_build import PATCH, cmake_args, has_amx, missing_from_build

AVX2 = frozenset({"avx", "avx2", "fma", "f16c", "bmi2"})
# The AMD EPYC with AVX-512 BF16/VNNI and no AMX; the Intel Xeon with AMX.
AVX512_EPYC = AVX2 | {"avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16"}
AMX_XEON = AVX512_EPYC | {"amx_tile", "amx_int8", "amx_bf16", "avx512_fp16"}

# llama.cpp 0.3.36's system info, as its builds printed it here (2026-11-29).
AVX2_BUILD = "CPU : SSE3 = 1 | SSSE3 = 1 | AVX = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | BMI2 = 1 | "
AVX512_BUILD = AVX2_BUILD + "AVX512 = 1 | AVX512_VNNI = 1 | AVX512_BF16 = 1 | "
AMX_BUILD = AVX512_BUILD + "AMX_INT8 = 1 | "
REST = "LLAMAFILE = 1 | OPENMP = 1 | REPACK = 1 |"


def test_an_amx_cpu_gets_avx512_and_the_amx_path():
    assert has_amx(AMX_XEON)
    assert cmake_args(AMX_XEON) == [
        "-DGGML_NATIVE=OFF",
        "-DGGML_AVX512=ON",
        "-DGGML_AVX512_VNNI=ON",
        "-DGGML_AVX512_BF16=ON",
        "-DGGML_AMX_TILE=ON",
        "-DGGML_AMX_INT8=ON",
        "-DGGML_AMX_BF16=ON",
    ]


def test_avx512_without_amx_turns_the_amx_path_off():
    assert not has_amx(AVX512_EPYC)
    assert cmake_args(AVX512_EPYC) == [
        "-DGGML_NATIVE=OFF",
        "-DGGML_AVX512=ON",
        "-DGGML_AVX512_VNNI=ON",
        "-DGGML_AVX512_BF16=ON",
        "-DGGML_AMX_TILE=OFF",
        "-DGGML_AMX_INT8=OFF",
        "-DGGML_AMX_BF16=OFF",
    ]


def test_avx512_without_bf16_or_vnni_leaves_them_out():
    assert cmake_args(AVX2 | {"avx512f", "avx512bw", "avx512vl"}) == [
        "-DGGML_NATIVE=OFF",
        "-DGGML_AVX512=ON",
        "-DGGML_AMX_TILE=OFF",
        "-DGGML_AMX_INT8=OFF",
        "-DGGML_AMX_BF16=OFF",
    ]


def test_avx2_only_leaves_the_choice_to_llama_cpp():
    assert cmake_args(AVX2) == ["-DGGML_NATIVE=OFF"]


def test_tiles_without_avx512_vnni_are_no_amx_path():
    # llama.cpp's AMX kernels use VNNI for single rows: it compiles them only with both
    assert not has_amx(AMX_XEON - {"avx512_vnni"})


def test_the_patch_touches_only_the_tile_configuration():
    text = PATCH.read_text()
    files = [line.split()[1] for line in text.splitlines() if line.startswith(("--- ", "+++ "))]
    assert files == [
        "a/vendor/llama.cpp/ggml/src/ggml-cpu/amx/mmq.cpp",
        "b/vendor/llama.cpp/ggml/src/ggml-cpu/amx/mmq.cpp",
    ]
    assert "static const tile_config_t tc" in text


def test_a_build_at_its_best_misses_nothing():
    assert missing_from_build(AMX_BUILD + REST, AMX_XEON) == []
    assert missing_from_build(AVX512_BUILD + REST, AVX512_EPYC) == []
    assert missing_from_build(AVX2_BUILD + REST, AVX2) == []


def test_the_build_without_amx_on_an_amx_cpu_misses_amx_int8():
    assert missing_from_build(AVX512_BUILD + REST, AMX_XEON) == ["AMX_INT8"]


def test_a_generic_build_on_an_avx512_cpu_misses_each_avx512_part():
    assert missing_from_build(AVX2_BUILD + REST, AVX512_EPYC) == [
        "AVX512",
        "AVX512_VNNI",
        "AVX512_BF16",
    ]


def test_a_feature_the_build_prints_as_0_is_missing():
    assert missing_from_build(AVX2_BUILD.replace("AVX2 = 1", "AVX2 = 0") + REST, AVX2) == ["AVX2"]
