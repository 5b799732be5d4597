"""A base install (no `llmbench[engine]` extra) runs the commands that need no engine, and an
engine command says in one line which extra to install. torch is hidden from the subprocess by
`sys.modules["torch"] = None`, which makes every `import torch` fail as if it were absent."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.harness.synthetic_runs import write_run

_WITHOUT_TORCH = """
import sys
sys.modules["torch"] = None
sys.argv = ["llmbench", *sys.argv[1:]]
try:
    from llmbench.cli.main import main
    main()
finally:
    loaded = [name for name, module in sys.modules.items() if module is not None]
    print("TORCH_LOADED" if any(n == "torch" or n.startswith("torch.") for n in loaded) else "")
"""


def llmbench_without_torch(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", _WITHOUT_TORCH, *args], capture_output=True, text=True, timeout=120
    )


def test_roofline_what_if_needs_no_torch():
    out = llmbench_without_torch(
        "roofline", "--model", "synthetic:smollm2-135m", "--hardware", "h100", "--json"
    )
    assert out.returncode == 0, out.stderr
    assert "TORCH_LOADED" not in out.stdout
    assert json.loads(out.stdout)["hardware"] == "h100"


def test_an_engine_command_names_the_extra_to_install():
    out = llmbench_without_torch("generate", "--model", "synthetic:tiny", "hi")
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        "error: this command runs the built-in engine, which needs torch: "
        "pip install 'llmbench[engine]'"
    ]


def test_compare_needs_no_torch(tmp_path):
    base = write_run(tmp_path / "base", seed=1)
    slower = write_run(tmp_path / "slower", seed=2, slowdown=1.2)
    page = tmp_path / "diff.html"
    out = llmbench_without_torch("compare", str(base), str(base), "--html", str(page))
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("llmbench compare: no regression")
    assert "TORCH_LOADED" not in out.stdout
    assert "<figure" in page.read_text()
    out = llmbench_without_torch("compare", str(base), str(slower), "--format", "json")
    assert out.returncode == 1, out.stderr
    assert "TORCH_LOADED" not in out.stdout
    assert json.loads(out.stdout)["has_regression"] is True


def test_report_needs_no_torch(tmp_path):
    folder = write_run(tmp_path / "run", seed=3)
    out = llmbench_without_torch("report", str(folder))
    assert out.returncode == 0, out.stderr
    assert "TORCH_LOADED" not in out.stdout
    assert out.stdout.split() == [str(folder / "report.html"), str(folder / "report.md")]
    assert "<figure" in (folder / "report.html").read_text()
