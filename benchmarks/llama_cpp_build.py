"""Build llama.cpp's Python binding from source at its best for this CPU, into the peers'
interpreter that `decode_peers.py --peers-python` runs.

    python benchmarks/llama_cpp_build.py --python /tmp/peers/bin/python

CMake options by the CPU's flags (`cmake_args`): GGML_NATIVE=OFF always (a native build would
take the build machine's flags as they are; these say which ones ran), then
- AMX (amx_tile, amx_int8, amx_bf16, with AVX-512 VNNI): AVX-512, VNNI and BF16 and llama.cpp's
  AMX path, its source patched first (`llama_cpp_amx_tile_config.patch`): gcc 12 drops the
  stores that fill the tile configuration on the stack before `ldtilecfg` (palette 1 is kept,
  every tile's rows and columns stay 0), so the first tile instruction raises SIGILL; the patch
  builds the configuration once in read-only memory.
- AVX-512 (avx512f, avx512bw, avx512vl; with VNNI and BF16 where the CPU has them): those,
  explicitly, AMX off.
- otherwise nothing more: with GGML_NATIVE=OFF llama.cpp turns AVX, AVX2, FMA, F16C and BMI2 on
  by itself.

The version is the one every table here was measured with (0.3.36); its sdist (~77 MB) comes
from PyPI. A build takes ~12 minutes on 2 cores. `--print` prints the options and builds nothing.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from llmbench.kernels.cpu_info import this_cpu_flags

VERSION = "0.3.36"
PATCH = Path(__file__).with_name("llama_cpp_amx_tile_config.patch")
AMX = ("amx_tile", "amx_int8", "amx_bf16")
AVX512 = ("avx512f", "avx512bw", "avx512vl")


def has_amx(flags: frozenset[str]) -> bool:
    """Whether llama.cpp's AMX path can run here (its tiles, int8 and bfloat16 products)."""
    return all(f in flags for f in (*AMX, *AVX512, "avx512_vnni"))


def cmake_args(flags: frozenset[str]) -> list[str]:
    """llama.cpp's CMake options at its best for a CPU with `flags` (a /proc/cpuinfo set)."""
    args = ["-DGGML_NATIVE=OFF"]
    if not all(f in flags for f in AVX512):
        return args
    args.append("-DGGML_AVX512=ON")
    if "avx512_vnni" in flags:
        args.append("-DGGML_AVX512_VNNI=ON")
    if "avx512_bf16" in flags:
        args.append("-DGGML_AVX512_BF16=ON")
    amx = "ON" if has_amx(flags) else "OFF"
    args += [f"-DGGML_AMX_TILE={amx}", f"-DGGML_AMX_INT8={amx}", f"-DGGML_AMX_BF16={amx}"]
    return args


# The name llama.cpp's system info (`AVX512 = 1 | AMX_INT8 = 1 | ...`) gives what an option of
# `cmake_args` turns on.
SYSTEM_INFO_NAMES = {
    "-DGGML_AVX512=ON": "AVX512",
    "-DGGML_AVX512_VNNI=ON": "AVX512_VNNI",
    "-DGGML_AVX512_BF16=ON": "AVX512_BF16",
    "-DGGML_AMX_INT8=ON": "AMX_INT8",
}


def missing_from_build(system_info: str, flags: frozenset[str]) -> list[str]:
    """What llama.cpp at its best for a CPU with `flags` uses and the build that printed
    `system_info` does not (its names, `AVX2`, `AMX_INT8`, ...): empty for a build at its best."""
    on = {name for name, value in re.findall(r"(\w+) = (\d+)", system_info) if value == "1"}
    wanted = ["AVX2"] if "avx2" in flags else []
    wanted += [SYSTEM_INFO_NAMES[a] for a in cmake_args(flags) if a in SYSTEM_INFO_NAMES]
    return [name for name in wanted if name not in on]


def _run(what: str, command: list[str], **kwargs) -> None:
    """Runs `command`; a failure ends the script in one line (its own output is above it)."""
    try:
        subprocess.run(command, check=True, **kwargs)
    except (OSError, subprocess.CalledProcessError) as e:
        sys.exit(f"llama_cpp_build.py: {what} failed ({e}); nothing was installed")


def build(python: str, flags: frozenset[str]) -> None:
    """pip-installs llama-cpp-python[server]==VERSION into `python`, built by `cmake_args`."""
    with tempfile.TemporaryDirectory(prefix="llama-cpp-build-") as tmp:
        pip = [python, "-m", "pip"]
        sdist = [*pip, "download", "--no-deps", "--no-binary", ":all:", "-d", tmp]
        _run("downloading the sdist", [*sdist, f"llama-cpp-python=={VERSION}"])
        with tarfile.open(next(Path(tmp).glob("llama_cpp_python-*.tar.gz"))) as archive:
            archive.extractall(tmp, filter="data")
        source = Path(tmp) / f"llama_cpp_python-{VERSION}"
        if has_amx(flags):
            _run("patching its AMX path", ["patch", "-p1", "-i", str(PATCH)], cwd=source)
        env = {**os.environ, "CMAKE_ARGS": " ".join(cmake_args(flags))}
        _run("building it", [*pip, "install", "--no-cache-dir", f"{source}[server]"], env=env)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", help="the peers' interpreter to install into")
    parser.add_argument("--print", action="store_true", help="print the CMake options only")
    args = parser.parse_args()
    flags = this_cpu_flags()
    print("CMAKE_ARGS=" + " ".join(cmake_args(flags)), flush=True)
    if args.print:
        return
    if not args.python:
        sys.exit("llama_cpp_build.py: --python PATH is needed (the peers' interpreter), or --print")
    build(args.python, flags)


if __name__ == "__main__":
    main()
