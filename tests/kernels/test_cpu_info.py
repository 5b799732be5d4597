"""Reading /proc/cpuinfo (`kernels.cpu_info`)."""

from __future__ import annotations

from llmbench.kernels import cpu_info


def test_cpu_flags_come_from_the_first_flags_line():
    cpuinfo = "processor\t: 0\nflags\t\t: fpu avx2 fma\nbugs\t\t: x\nflags\t\t: sse\n"
    assert cpu_info.cpu_flags(cpuinfo) == {"fpu", "avx2", "fma"}
    assert cpu_info.cpu_flags("processor : 0\n") == frozenset()


def test_native_bf16_needs_avx512_bf16_or_amx_bf16():
    assert cpu_info.has_native_bf16(frozenset({"avx512f", "avx512_bf16"}))
    assert cpu_info.has_native_bf16(frozenset({"amx_tile", "amx_bf16"}))
    # an AMD EPYC with AVX2 only (Zen 3), and AVX-512 without BF16 (Cascade Lake)
    assert not cpu_info.has_native_bf16(frozenset({"avx2", "fma", "f16c"}))
    assert not cpu_info.has_native_bf16(frozenset({"avx512f", "avx512_vnni"}))


def test_bf16_multiplies_in_float32_only_on_a_cpu_without_bf16_products():
    avx2_only, avx512_bf16 = frozenset({"avx2", "fma", "f16c"}), frozenset({"avx512_bf16"})
    assert cpu_info.multiplies_in_float32("bfloat16", "cpu", avx2_only)
    assert not cpu_info.multiplies_in_float32("bfloat16", "cpu", avx512_bf16)
    assert not cpu_info.multiplies_in_float32("bfloat16", "cuda", avx2_only)
    assert not cpu_info.multiplies_in_float32("float16", "cpu", avx2_only)
