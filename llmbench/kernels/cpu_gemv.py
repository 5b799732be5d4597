"""Decode matmuls on the CPU through a C++ extension: build, load, reference, cost, checks.

    y[M, N] = x[M, K] @ W[N, K]^T (+ bias[N]) (+ residual[M, N])   W bfloat16, float16 or
                                                                    float32, float32 sums,
                                                                    y in x's dtype

torch's own bfloat16 one-row product streams W at about half this machine's read bandwidth
(float32 through MKL at about 40%);
`csrc/gemv.cpp` streams each row of W once (VDPBF16PS where the CPU has AVX512_BF16) and is
the CPU fast path for rows ≤ `max_rows` (decode). It is compiled on first use with
`torch.utils.cpp_extension` (needs a C++ compiler and ninja) into the llmbench cache
($LLMBENCH_CACHE, default ~/.cache/llmbench, under `cpp_extensions/`), with flags chosen from
/proc/cpuinfo; the build time is recorded once next to the library and every later process
loads the cached library without compiling.

    LLMBENCH_CPU_GEMV=auto (default)  the extension where it builds, else torch's matmul
    LLMBENCH_CPU_GEMV=ext             the extension, or an error saying why it cannot run
    LLMBENCH_CPU_GEMV=torch           torch's matmul

`CpuGemv.describe()` is what a run records in its provenance.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import shutil
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

from llmbench.kernels.checks import (
    CPU,
    check_bias_and_residual,
    check_same_dtype,
    check_shape,
    check_tensor,
)
from llmbench.kernels.cost import KernelCost, dtype_bytes
from llmbench.kernels.cpu_info import this_cpu_flags
from llmbench.kernels.errors import KernelDispatchError

OP = "cpu_gemv"
ENV_VAR = "LLMBENCH_CPU_GEMV"
CHOICES = ("auto", "ext", "torch")
# One library: the matmul, the int8/int4 matmul (`cpu_quant_gemv`), the per-layer ops and the
# fused decode layer (`cpu_layer_ops`) register into one namespace; HEADERS are compiled in.
CSRC = Path(__file__).parent / "csrc"
SOURCES = tuple(
    CSRC / name for name in ("gemv.cpp", "gemv_quant.cpp", "layer_ops.cpp", "decode_layer.cpp")
)
HEADERS = (CSRC / "simd.h",)
WEIGHT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
# Up to this many rows of x the extension beats torch's matmul (`max_rows`). bfloat16: measured
# below; float16: always (torch has no fast float16 CPU matmul: ~0.3 GFLOP/s here); float32:
# SmolLM2-135M's 120 layer matrices from DRAM, 2 threads, at load ≈ 2.5 (tests running), best
# of 10: 8.4 ms (50 GB/s) vs 19.5 for MKL on the input-major layout at one row, 9.7 vs 36.0 at
# 4, 15.5 vs 43.1 at 16.
MAX_ROWS_BF16 = 16
MAX_ROWS_F16 = 1 << 30
MAX_ROWS_F32 = 16

# Compiler flags per instruction set, best first; each needs all its /proc/cpuinfo flags.
# "vnni" in the name: the int8/int4 matmul (`cpu_quant_gemv`) is built too.
ISA_FLAGS = (
    (
        "avx512bf16_vnni",
        ("avx512f", "avx512bw", "avx512vl", "avx512_bf16", "avx512_vnni", "f16c", "fma"),
        (
            "-mavx512f",
            "-mavx512bw",
            "-mavx512vl",
            "-mavx512bf16",
            "-mavx512vnni",
            "-mf16c",
            "-mfma",
        ),
    ),
    (
        "avx512_vnni",
        ("avx512f", "avx512bw", "avx512vl", "avx512_vnni", "f16c", "fma"),
        ("-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512vnni", "-mf16c", "-mfma"),
    ),
    (
        "avx512bf16",
        ("avx512f", "avx512bw", "avx512vl", "avx512_bf16", "f16c", "fma"),
        ("-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512bf16", "-mf16c", "-mfma"),
    ),
    (
        "avx512",
        ("avx512f", "avx512bw", "avx512vl", "f16c", "fma"),
        ("-mavx512f", "-mavx512bw", "-mavx512vl", "-mf16c", "-mfma"),
    ),
    ("avx2", ("avx2", "f16c", "fma"), ("-mavx2", "-mf16c", "-mfma")),
)


def choose_isa(flags: frozenset[str]) -> tuple[str, tuple[str, ...]]:
    """(instruction set name, compiler flags) for a CPU with `flags`: the first of ISA_FLAGS
    it fully has, else ("scalar", ())."""
    for name, needed, cflags in ISA_FLAGS:
        if all(f in flags for f in needed):
            return name, cflags
    return "scalar", ()


def cache_dir(env: Mapping[str, str] | None = None) -> Path:
    """Where built extensions live: $LLMBENCH_CACHE/cpp_extensions (default ~/.cache/llmbench)."""
    env = os.environ if env is None else env
    base = Path(env.get("LLMBENCH_CACHE") or Path.home() / ".cache" / "llmbench")
    return base / "cpp_extensions"


def build_name(source: bytes, isa: str, cflags: tuple[str, ...], torch_version: str) -> str:
    """The library's name (and op namespace): changes with the source, flags and torch, so a
    cached build is never reused for another one."""
    digest = hashlib.sha256(
        b"\0".join([source, " ".join(cflags).encode(), torch_version.encode()])
    ).hexdigest()
    return f"llmbench_cpu_gemv_{isa}_{digest[:12]}"


@dataclass(frozen=True)
class CpuGemv:
    """The CPU C++ extension in use: "extension" (the library, loaded) or "torch", and why."""

    implementation: str
    reason: str
    isa: str | None = None
    namespace: str | None = None
    build_s: float | None = None  # the one-time compile, as recorded when it was built
    is_cached: bool = False  # loaded from an earlier build (no compile in this process)

    @property
    def is_extension(self) -> bool:
        return self.implementation == "extension"

    @property
    def has_quant_gemv(self) -> bool:
        """Built with AVX-512 VNNI: the int8/int4 matmul of `cpu_quant_gemv` is in it."""
        return self.is_extension and "vnni" in (self.isa or "")

    def op(self, name: str = "gemv"):
        """The loaded library's op `name`: `gemv(x, weight, bias, residual)`, `quant_gemv`
        (`cpu_quant_gemv`), or one of `cpu_layer_ops`' (rms_norm, rope_,
        paged_decode_attention, decode_layer)."""
        if not self.is_extension:
            raise KernelDispatchError(f"{OP}: the extension is not in use ({self.reason})")
        return getattr(getattr(torch.ops, self.namespace), name).default

    def describe(self) -> str:
        """One line for provenance, e.g. "C++ extension (avx512bf16; built in 41.2 s, cached)"."""
        if not self.is_extension:
            return f"torch matmul ({self.reason})"
        built = f"built in {self.build_s:.1f} s" if self.build_s is not None else "built"
        return f"C++ extension ({self.isa}; {built}{', cached' if self.is_cached else ''})"


def max_rows(dtype: torch.dtype) -> int:
    """The most rows of x for which the model calls the extension instead of torch."""
    return {torch.bfloat16: MAX_ROWS_BF16, torch.float32: MAX_ROWS_F32}.get(dtype, MAX_ROWS_F16)


def _compiler(env: Mapping[str, str]) -> str | None:
    """The C++ compiler torch's extension builder will call ($CXX, else c++), if it exists."""
    return shutil.which(env.get("CXX") or "c++")


def _build(name: str, cflags: tuple[str, ...], directory: Path) -> None:
    """Compile and load SOURCES as `name` in `directory` (torch's JIT builder: ninja + $CXX)."""
    from torch.utils import cpp_extension

    directory.mkdir(parents=True, exist_ok=True)
    cpp_extension.load(
        name=name,
        sources=[str(source) for source in SOURCES],
        extra_cflags=["-O3", *cflags, "-fopenmp", f"-DLLMBENCH_GEMV_NAMESPACE={name}"],
        extra_ldflags=["-fopenmp"],
        build_directory=str(directory),
        is_python_module=False,
        verbose=False,
    )


# Libraries loaded in this process, by name: a TORCH_LIBRARY namespace registers only once.
_LOADED: dict[str, Path] = {}


def load(
    directory: Path | None = None,
    env: Mapping[str, str] | None = None,
    flags: frozenset[str] | None = None,
) -> CpuGemv:
    """The CPU C++ extension under `env` (default: the process environment): the extension
    loaded from `directory` (default `cache_dir(env)`), built there first if it is not, or
    torch's matmul with the reason. LLMBENCH_CPU_GEMV=ext turns every reason into an error."""
    env = os.environ if env is None else env
    choice = env.get(ENV_VAR, "auto").strip().lower() or "auto"
    if choice not in CHOICES:
        raise KernelDispatchError(f"{ENV_VAR}={choice}: unknown; use one of {', '.join(CHOICES)}")
    if choice == "torch":
        return CpuGemv("torch", f"{ENV_VAR}=torch")
    result = _load_extension(directory or cache_dir(env), env, flags)
    if choice == "ext" and not result.is_extension:
        raise KernelDispatchError(f"{ENV_VAR}=ext: {result.reason}")
    return result


def _load_extension(
    directory: Path, env: Mapping[str, str], flags: frozenset[str] | None
) -> CpuGemv:
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return CpuGemv("torch", f"no extension for {platform.machine()} CPUs")
    isa, cflags = choose_isa(this_cpu_flags() if flags is None else flags)
    source = b"\0".join(path.read_bytes() for path in (*SOURCES, *HEADERS))
    name = build_name(source, isa, cflags, torch.__version__)
    build_dir = directory / name
    library = build_dir / f"{name}.so"
    record = build_dir / "build.json"
    if library.exists() and record.exists():
        if name not in _LOADED:
            torch.ops.load_library(str(library))
            _LOADED[name] = library
        build_s = json.loads(record.read_text())["build_s"]
        return CpuGemv("extension", "loaded", isa, name, build_s, is_cached=True)
    if _compiler(env) is None:
        return CpuGemv("torch", f"no C++ compiler ({env.get('CXX') or 'c++'} not found)")
    from torch.utils import cpp_extension

    if not cpp_extension.is_ninja_available():
        return CpuGemv("torch", "ninja not found (pip install ninja)")
    if name in _LOADED:  # the same build, loaded from another directory in this process
        build_s = json.loads((_LOADED[name].parent / "build.json").read_text())["build_s"]
        return CpuGemv("extension", "loaded", isa, name, build_s, is_cached=True)
    print(f"llmbench: compiling the CPU C++ extension ({isa}, once)...", file=sys.stderr)
    t0 = time.perf_counter()
    try:
        _build(name, cflags, build_dir)
    except Exception as e:  # a compiler error, a missing header: the torch path instead
        first_line = (str(e).strip().splitlines() or [type(e).__name__])[0]
        return CpuGemv("torch", f"build failed: {first_line[:200]}")
    build_s = round(time.perf_counter() - t0, 2)
    _LOADED[name] = library
    record.write_text(
        json.dumps(
            {
                "build_s": build_s,
                "isa": isa,
                "cflags": list(cflags),
                "torch": torch.__version__,
                "built_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
            }
        )
    )
    print(f"llmbench: CPU C++ extension built in {build_s:.1f} s ({build_dir})", file=sys.stderr)
    return CpuGemv("extension", "built", isa, name, build_s, is_cached=False)


@functools.cache
def default() -> CpuGemv:
    """The process's CPU C++ extension (loaded once); a build failure prints one line."""
    result = load()
    if not result.is_extension and result.reason.startswith(("build failed", "no C++", "ninja")):
        print(f"llmbench: CPU C++ extension falls back to torch: {result.reason}", file=sys.stderr)
    return result


def check_gemv_args(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    residual: torch.Tensor | None = None,
) -> None:
    """Raise KernelArgumentError naming the argument unless the layout is what the op reads."""
    check_tensor(OP, "weight", weight, "[N, K]", WEIGHT_DTYPES, contiguous_dims=2, device=CPU)
    check_tensor(OP, "x", x, "[M, K]", WEIGHT_DTYPES, device=CPU)
    check_same_dtype(OP, "x", x, "weight", weight.dtype)
    num_rows, out_features = x.shape[0], weight.shape[0]
    check_shape(OP, "x", x, (num_rows, weight.shape[1]), "[M, K]")
    check_bias_and_residual(OP, x, out_features, bias, residual)


def gemv(
    backend: CpuGemv,
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    residual: torch.Tensor | None = None,
) -> torch.Tensor:
    """x [M, K] @ weight[N, K]^T (+ bias) (+ residual) → [M, N] through the extension, checked."""
    check_gemv_args(x, weight, bias, residual)
    return backend.op()(x, weight, bias, residual)


def gemv_reference(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    residual: torch.Tensor | None = None,
) -> torch.Tensor:
    """The same product in float32, the adds included, rounded once to x's dtype."""
    y = x.float() @ weight.float().t()
    if bias is not None:
        y = y + bias.float()
    if residual is not None:
        y = y + residual.float()
    return y.to(x.dtype)


def gemv_cost(
    num_rows: int,
    out_features: int,
    in_features: int,
    dtype: object,
    has_bias: bool = False,
    has_residual: bool = False,
) -> KernelCost:
    """Bytes and FLOPs of one call.

    Formula: bytes = e·(N·K + M·K + M·N + [bias] N + [residual] M·N), flops = 2·M·N·K
    (+ M·N per add), with e the bytes per element of the 16-bit dtype.
    """
    e = dtype_bytes(dtype)
    m, n, k = num_rows, out_features, in_features
    elements = n * k + m * k + m * n + (n if has_bias else 0) + (m * n if has_residual else 0)
    flops = 2 * m * n * k + (m * n if has_bias else 0) + (m * n if has_residual else 0)
    return KernelCost(int(elements * e), flops)
