"""The CPU C++ extension: which instruction set, where it is cached, how it is built and loaded.

One library holds every CPU op of the kernels layer (`csrc/`): the 16-bit and float32 decode
matmul (`cpu_gemv`), the int8/int4 matmul (`cpu_quant_gemv`), RMSNorm, RoPE, paged decode
attention and the fused decode layer (`cpu_layer_ops`); those modules check their arguments and
call the ops of the `CpuExtension` this module hands them. It is compiled on first use with
`torch.utils.cpp_extension` (needs a C++ compiler and ninja) into the llmbench cache
($LLMBENCH_CACHE, default ~/.cache/llmbench, under `cpp_extensions/`), with flags chosen from
/proc/cpuinfo; the build time is recorded once next to the library (the next first build on the
machine quotes it as its estimate) and every later process loads the cached library without
compiling.

    LLMBENCH_CPU_EXTENSION=auto (default)  the extension where it builds, else torch's ops
    LLMBENCH_CPU_EXTENSION=ext             the extension, or an error saying why it cannot run
    LLMBENCH_CPU_EXTENSION=torch           torch's ops
    LLMBENCH_CPU_ISA=avx512bf16_vnni       built for that instruction set (one of `ISA_NAMES`)
                                           instead of the best this CPU has: what a CPU without
                                           AMX, say, runs, measured and tested on this one

`LLMBENCH_CPU_GEMV`, its name while the library held only the matmul, is read (same values) when
LLMBENCH_CPU_EXTENSION is unset; it is deprecated and says so on stderr once per process.

`CpuExtension.describe()` is what a run records in its provenance.
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

from llmbench.kernels.cpu_info import this_cpu_flags
from llmbench.kernels.errors import KernelDispatchError

ENV_VAR = "LLMBENCH_CPU_EXTENSION"
DEPRECATED_ENV_VAR = "LLMBENCH_CPU_GEMV"  # read when ENV_VAR is unset
CHOICES = ("auto", "ext", "torch")
LIBRARY_PREFIX = "llmbench_cpu_ext_"  # + "<isa>_<build hash>": the library and its op namespace
# The ops of every source register into that one namespace; the headers are compiled in (any
# `*.h` here: the build hash covers a new one, and the wheel ships every file of csrc/).
CSRC = Path(__file__).parent / "csrc"
SOURCES = tuple(
    CSRC / name
    for name in (
        "gemv.cpp",
        "gemv_amx.cpp",
        "gemv_quant.cpp",
        "gemm_vectors.cpp",
        "gemm_float32_panels.cpp",
        "layer_ops.cpp",
        "decode_attention.cpp",
        "decode_attention_tiles.cpp",
        "decode_layer.cpp",
        "prefill_attention.cpp",
        "prefill_attention_vectors.cpp",
    )
)
HEADERS = tuple(sorted(CSRC.glob("*.h")))
# What the first build's notice quotes when this machine has no recorded build: builds on this
# 2-core Intel Xeon (AVX-512 BF16/VNNI) took 20-23 s when quiet, 45-66 s with other jobs running;
# with AMX and seven sources, 25-29 s quiet (2026-11-27); nine, 28-31 s; ten, 32-33 s (2026-11-28).
NO_RECORD_ESTIMATE = "about a minute on 2 cores"

# Compiler flags per instruction set, best first; each needs all its /proc/cpuinfo flags.
# Every set but "scalar" builds the int8/int4 matmul (`cpu_quant_gemv`: VPDPBUSD where "vnni" is
# in the name, else AVX2's byte products); "amx": bfloat16 products of several rows, and
# int8/int4 prefill products, on the AMX tiles (`csrc/gemv_amx.cpp`, where the OS allows them).
ISA_FLAGS = (
    (
        "avx512bf16_vnni_amx",
        (
            *("avx512f", "avx512bw", "avx512vl", "avx512_bf16", "avx512_vnni", "f16c", "fma"),
            *("amx_tile", "amx_bf16"),
        ),
        (
            *("-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512bf16", "-mavx512vnni"),
            *("-mf16c", "-mfma", "-mamx-tile", "-mamx-bf16"),
        ),
    ),
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


ISA_ENV_VAR = "LLMBENCH_CPU_ISA"
ISA_NAMES = (*(name for name, _, _ in ISA_FLAGS), "scalar")
_ISA_BY_NAME = {name: (needed, cflags) for name, needed, cflags in ISA_FLAGS} | {"scalar": ((), ())}


def runnable_isas(flags: frozenset[str]) -> list[str]:
    """The instruction sets of ISA_NAMES a CPU with `flags` runs, best first."""
    return [name for name, needed, _ in ISA_FLAGS if all(f in flags for f in needed)] + ["scalar"]


def choose_isa(flags: frozenset[str], wanted: str | None = None) -> tuple[str, tuple[str, ...]]:
    """(instruction set name, compiler flags) for a CPU with `flags`: the first of ISA_FLAGS
    it fully has, else ("scalar", ()); with `wanted` (ISA_ENV_VAR's value), that one, or
    KernelDispatchError if it is unknown or the CPU lacks one of its flags."""
    runnable = runnable_isas(flags)
    name = wanted or runnable[0]
    if name not in _ISA_BY_NAME:
        raise KernelDispatchError(
            f"{ISA_ENV_VAR}={name}: unknown instruction set; use one of {', '.join(ISA_NAMES)}"
        )
    needed, cflags = _ISA_BY_NAME[name]
    if name not in runnable:
        lacks = ", ".join(f for f in needed if f not in flags)
        raise KernelDispatchError(
            f"{ISA_ENV_VAR}={name}: this CPU lacks {lacks}; it runs {', '.join(runnable)}"
        )
    return name, cflags


def wanted_isa(env: Mapping[str, str]) -> str | None:
    """ISA_ENV_VAR's value, lower-cased (None when empty or unset)."""
    return env.get(ISA_ENV_VAR, "").strip().lower() or None


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
    return f"{LIBRARY_PREFIX}{isa}_{digest[:12]}"


@dataclass(frozen=True)
class CpuExtension:
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
        """Built for AVX2 or better (not "scalar"): the int8/int4 matmul of `cpu_quant_gemv` is
        in it (AVX-512 VNNI's or AVX2's)."""
        return self.is_extension and self.isa not in (None, "scalar")

    def op(self, name: str):
        """The loaded library's op `name`: `gemv` (`cpu_gemv`), `quant_gemv` or `quant_gemm`
        (`cpu_quant_gemv`), or one of `cpu_layer_ops`' (rms_norm, rope_,
        paged_decode_attention, decode_layer)."""
        if not self.is_extension:
            raise KernelDispatchError(f"{name}: the C++ extension is not in use ({self.reason})")
        return getattr(getattr(torch.ops, self.namespace), name).default

    def describe(self) -> str:
        """One line for provenance, e.g. "C++ extension (avx512bf16; built in 41.2 s, cached)"."""
        if not self.is_extension:
            return f"torch matmul ({self.reason})"
        built = f"built in {self.build_s:.1f} s" if self.build_s is not None else "built"
        return f"C++ extension ({self.isa}; {built}{', cached' if self.is_cached else ''})"


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
        extra_cflags=["-O3", *cflags, "-fopenmp", f"-DLLMBENCH_EXTENSION_NAMESPACE={name}"],
        extra_ldflags=["-fopenmp"],
        build_directory=str(directory),
        is_python_module=False,
        verbose=False,
    )


def last_build_s(directory: Path) -> float | None:
    """The compile time of the newest build recorded under `directory` (any ISA, torch or
    source; earlier names of the library included), or None where none is."""
    latest: tuple[str, float] | None = None
    for record in directory.glob("*/build.json"):
        try:
            data = json.loads(record.read_text())
            built = (str(data["built_at"]), float(data["build_s"]))
        except (OSError, ValueError, KeyError, TypeError):
            continue  # a half-written or foreign record: not an estimate
        latest = built if latest is None or built > latest else latest
    return None if latest is None else latest[1]


def compile_notice(isa: str, directory: Path) -> str:
    """The line printed when the build starts: what is compiled and how long it usually takes
    (the last build recorded under `directory`, else NO_RECORD_ESTIMATE)."""
    build_s = last_build_s(directory)
    usually = NO_RECORD_ESTIMATE if build_s is None else f"the last build here took {build_s:.0f} s"
    return f"llmbench: compiling the CPU C++ extension ({isa}), once per machine: {usually}..."


@functools.cache
def _note_deprecated_name() -> None:
    """Say once per process that the old variable name was read."""
    print(
        f"llmbench: {DEPRECATED_ENV_VAR} is deprecated; set {ENV_VAR} instead (same values)",
        file=sys.stderr,
    )


def choice_of(env: Mapping[str, str]) -> tuple[str, str]:
    """(the variable read, its value, lower-cased; "auto" when empty or unset): ENV_VAR, else
    DEPRECATED_ENV_VAR."""
    name = ENV_VAR
    if ENV_VAR not in env and DEPRECATED_ENV_VAR in env:
        name = DEPRECATED_ENV_VAR
        _note_deprecated_name()
    return name, env.get(name, "auto").strip().lower() or "auto"


# Libraries loaded in this process, by name: a TORCH_LIBRARY namespace registers only once.
_LOADED: dict[str, Path] = {}


def load(
    directory: Path | None = None,
    env: Mapping[str, str] | None = None,
    flags: frozenset[str] | None = None,
) -> CpuExtension:
    """The CPU C++ extension under `env` (default: the process environment): the extension
    loaded from `directory` (default `cache_dir(env)`), built there first if it is not, or
    torch's ops with the reason. LLMBENCH_CPU_EXTENSION=ext turns every reason into an error;
    an ISA_ENV_VAR this CPU cannot run is one (`choose_isa`)."""
    env = os.environ if env is None else env
    name, choice = choice_of(env)
    if choice not in CHOICES:
        raise KernelDispatchError(f"{name}={choice}: unknown; use one of {', '.join(CHOICES)}")
    if choice == "torch":
        return CpuExtension("torch", f"{name}=torch")
    result = _load_extension(directory or cache_dir(env), env, flags)
    if choice == "ext" and not result.is_extension:
        raise KernelDispatchError(f"{name}=ext: {result.reason}")
    return result


def _load_extension(
    directory: Path, env: Mapping[str, str], flags: frozenset[str] | None
) -> CpuExtension:
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return CpuExtension("torch", f"no extension for {platform.machine()} CPUs")
    isa, cflags = choose_isa(this_cpu_flags() if flags is None else flags, wanted_isa(env))
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
        return CpuExtension("extension", "loaded", isa, name, build_s, is_cached=True)
    if _compiler(env) is None:
        return CpuExtension("torch", f"no C++ compiler ({env.get('CXX') or 'c++'} not found)")
    from torch.utils import cpp_extension

    if not cpp_extension.is_ninja_available():
        return CpuExtension("torch", "ninja not found (pip install ninja)")
    if name in _LOADED:  # the same build, loaded from another directory in this process
        build_s = json.loads((_LOADED[name].parent / "build.json").read_text())["build_s"]
        return CpuExtension("extension", "loaded", isa, name, build_s, is_cached=True)
    print(compile_notice(isa, directory), file=sys.stderr)
    t0 = time.perf_counter()
    try:
        _build(name, cflags, build_dir)
    except Exception as e:  # a compiler error, a missing header: the torch path instead
        first_line = (str(e).strip().splitlines() or [type(e).__name__])[0]
        return CpuExtension("torch", f"build failed: {first_line[:200]}")
    build_s = round(time.perf_counter() - t0, 2)
    _LOADED[name] = library
    info = {
        "build_s": build_s,
        "isa": isa,
        "cflags": list(cflags),
        "torch": torch.__version__,
        "built_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }
    # Processes that start on an empty cache together (the test suite's workers) all call the
    # builder; torch's lock lets one compile while the others wait for it. The first record
    # written stands, and every process reports that one build time.
    # (Written whole, then linked into place: a reader never sees half of it.)
    draft = build_dir / f"build.{os.getpid()}.json"
    draft.write_text(json.dumps(info))
    try:
        os.link(draft, record)
    except FileExistsError:
        build_s = json.loads(record.read_text())["build_s"]
    finally:
        draft.unlink()
    print(f"llmbench: CPU C++ extension built in {build_s:.1f} s ({build_dir})", file=sys.stderr)
    return CpuExtension("extension", "built", isa, name, build_s, is_cached=False)


@functools.cache
def default() -> CpuExtension:
    """The process's CPU C++ extension (loaded once); a build failure prints one line."""
    result = load()
    if not result.is_extension and result.reason.startswith(("build failed", "no C++", "ninja")):
        print(f"llmbench: CPU C++ extension falls back to torch: {result.reason}", file=sys.stderr)
    return result
