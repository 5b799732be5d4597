"""The wheel: built from this checkout and installed where the source tree cannot be seen, it
compiles the CPU C++ extension from the files it ships and generates through it.

A wheel that leaves out a file the build needs (it once shipped csrc/*.cpp without csrc/simd.h)
installs fine and then quietly runs torch's slow path: only a build from the installed files
shows it. Nothing is downloaded: the wheel is built without build isolation (this environment's
setuptools), installed with --no-deps into a fresh virtual environment, which sees this
environment's packages (torch, tokenizers, ...) through a .pth file, as a second site directory
after its own. Most of the time is the one compile (20-45 s on 2 cores); the test is `slow` so
that `-m "not slow"` leaves it out, and it runs in the default run.
"""

from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CSRC = REPO / "llmbench" / "kernels" / "csrc"
# Not copied for the build: caches, environments, earlier builds, run outputs.
NOT_SOURCES = (".git", ".venv", "*.egg-info", "build", "dist", "runs", "__pycache__", ".*cache")
# Variables that would force a path, or point Python at the source tree.
FORCING = ("LLMBENCH_CPU_EXTENSION", "LLMBENCH_CPU_GEMV", "LLMBENCH_KERNELS", "PYTHONPATH")
TIMEOUT_S = 600


def _run(command: list[str], cwd: Path, env: dict[str, str] | None = None):
    result = subprocess.run(
        command, cwd=cwd, env=env, capture_output=True, text=True, timeout=TIMEOUT_S
    )
    assert result.returncode == 0, f"{command[:4]}...: {result.stdout}\n{result.stderr}"
    return result


def _build_wheel(tmp_path: Path) -> Path:
    """The wheel of a copy of the checkout (setuptools writes build/ and *.egg-info next to
    the sources it builds: not into the working tree)."""
    sources = tmp_path / "sources"
    shutil.copytree(REPO, sources, ignore=shutil.ignore_patterns(*NOT_SOURCES), symlinks=True)
    dist = tmp_path / "dist"
    pip = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index"]
    _run([*pip, "--quiet", "-w", str(dist), str(sources)], tmp_path)
    (wheel,) = dist.glob("llmbench-*.whl")
    return wheel


def _install(wheel: Path, venv: Path) -> Path:
    """A fresh virtual environment with the wheel alone installed in it, this environment's
    site-packages visible after its own, and ninja on its PATH as `pip install
    'llmbench[engine]'` would put it; returns its bin folder."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    bin_dir = venv / "bin"
    python = str(bin_dir / "python")
    install = [sys.executable, "-m", "pip", "--python", python, "install", "--no-deps"]
    _run([*install, "--no-index", "--quiet", str(wheel)], venv)
    code = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    site_packages = Path(_run([python, "-c", code], venv).stdout.strip())
    ours = dict.fromkeys(sysconfig.get_paths()[key] for key in ("purelib", "platlib"))
    (site_packages / "host_packages.pth").write_text("\n".join(ours) + "\n")
    search = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    ninja = shutil.which("ninja", path=search)
    assert ninja is not None, "ninja is not installed (the engine extra installs it)"
    (bin_dir / "ninja").symlink_to(ninja)
    return bin_dir


@pytest.mark.slow
@pytest.mark.skipif(
    platform.machine().lower() not in ("x86_64", "amd64"),
    reason="the CPU C++ extension is built for x86-64 only",
)
def test_the_installed_wheel_builds_and_runs_the_cpu_extension(tmp_path):
    wheel = _build_wheel(tmp_path)
    shipped = set(zipfile.ZipFile(wheel).namelist())
    needed = {f"llmbench/kernels/csrc/{path.name}" for path in CSRC.iterdir()}
    assert needed <= shipped, f"the wheel leaves out {sorted(needed - shipped)}"

    bin_dir = _install(wheel, tmp_path / "venv")
    env = {key: value for key, value in os.environ.items() if key not in FORCING}
    env["PATH"] = os.pathsep.join([str(bin_dir), env.get("PATH", "")])
    env["LLMBENCH_CACHE"] = str(tmp_path / "cache")  # nothing built yet
    cwd = tmp_path / "elsewhere"  # not the checkout: `import llmbench` must not find it
    cwd.mkdir()
    where = _run([str(bin_dir / "python"), "-c", "import llmbench; print(llmbench.__file__)"], cwd)
    assert Path(where.stdout.strip()).is_relative_to(tmp_path / "venv"), where.stdout

    command = [str(bin_dir / "llmbench"), "generate", "--model", "synthetic:tiny"]
    command += ["--device", "cpu", "--max-tokens", "4", "--ignore-eos", "hello"]
    result = _run(command, cwd, env)
    assert "llmbench: compiling the CPU C++ extension (" in result.stderr
    assert "falls back to torch" not in result.stderr, result.stderr
    # The timing line names what ran the layers.
    assert re.search(r", cpu, C\+\+ extension \(\w+\), weights ", result.stderr), result.stderr
    built = (tmp_path / "cache" / "cpp_extensions").glob("llmbench_cpu_ext_*/build.json")
    assert len(list(built)) == 1  # from the installed files, into the fresh cache
