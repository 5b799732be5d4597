"""The extension's kernels built for the instruction set one below this CPU's best, checked
against their references: on an Intel Xeon with AMX that is AVX-512 BF16 + VNNI, what an AMD
EPYC runs; on that EPYC, AVX-512 VNNI without BF16. CI's machine takes its best set only, so
without this the other paths' code (`#ifdef __AMX_TILE__`'s else branches, the bfloat16
emulation) would first be compiled and run on another kind of CPU.

The parity tests of `PARITY_FILES` run again in a child pytest with LLMBENCH_CPU_ISA set; the
build lands in the same llmbench cache (one compile per machine and source, ~25 s here). By
hand, every set this Intel Xeon runs passed them (2026-11-28); the first run found the
int8/int4 prefill product without tiles rounding a bfloat16 y three times (mm, + bias,
+ residual), now once (`gemv_quant.cpp`'s addmm). On an AMD EPYC with AVX2 only, the set below
is the scalar one (no int8/int4 kernel: its tests are deselected there)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from llmbench.kernels import cpu_extension
from llmbench.kernels.cpu_info import this_cpu_flags

ROOT = Path(__file__).resolve().parents[2]
PARITY_FILES = (
    "tests/kernels/test_cpu_gemv.py",
    "tests/kernels/test_cpu_layer_ops.py",
    "tests/kernels/test_cpu_prefill_attention.py",
    "tests/engine/test_model_cpu_extension.py",
    "tests/engine/quant",
    "tests/kernels/test_cpu_quant_gemv.py",  # its `quant_kernel` tests: not on a scalar build
)


def test_the_kernels_match_their_references_one_instruction_set_down():
    runnable = cpu_extension.runnable_isas(this_cpu_flags())
    if len(runnable) == 1:
        pytest.skip("this CPU builds the scalar extension only: there is no set below it")
    lesser = runnable[1]
    env = os.environ | {cpu_extension.ISA_ENV_VAR: lesser}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", *PARITY_FILES, "-q", "-n", "0", "-p", "no:cacheprovider"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    tail = done.stdout[-3000:]
    assert done.returncode == 0, tail
    assert " passed" in tail.splitlines()[-1] and "skipped" not in tail.splitlines()[-1], tail
