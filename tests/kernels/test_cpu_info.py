"""Reading /proc/cpuinfo (`kernels.cpu_info`)."""

from __future__ import annotations

from llmbench.kernels import cpu_info


def test_cpu_flags_come_from_the_first_flags_line():
    cpuinfo = "processor\t: 0\nflags\t\t: fpu avx2 fma\nbugs\t\t: x\nflags\t\t: sse\n"
    assert cpu_info.cpu_flags(cpuinfo) == {"fpu", "avx2", "fma"}
    assert cpu_info.cpu_flags("processor : 0\n") == frozenset()
