"""The import rules, checked on the source: a layer imports only the layers below it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "llmbench"

# What each layer may import from llmbench (besides itself and llmbench.errors).
ALLOWED = {
    "kernels": set(),
    "engine": {"kernels"},
    "harness": {"engine", "kernels"},  # only lazily, inside functions (see below)
    "reports": {"harness"},  # its torch-free modules: records, metrics, results
    "cli": {"kernels", "engine", "harness", "reports"},
}
HEAVY = ("torch", "llmbench.engine", "llmbench.kernels")
# The harness modules that may import the engine at module level: they run it in-process.
ENGINE_SIDE = {"harness/backends/engine.py", "harness/engine_client.py"}


def _imports(tree: ast.AST, top_level_only: bool) -> list[str]:
    nodes = tree.body if top_level_only else ast.walk(tree)
    names = []
    for node in nodes:
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.append(node.module)
    return names


def _modules(layer: str) -> list[Path]:
    return sorted((ROOT / layer).rglob("*.py"))


@pytest.mark.parametrize("layer", [layer for layer in ALLOWED if (ROOT / layer).is_dir()])
def test_layer_imports_only_what_it_may(layer):
    for path in _modules(layer):
        for name in _imports(ast.parse(path.read_text()), top_level_only=False):
            if not name.startswith("llmbench.") or name == "llmbench.errors":
                continue
            target = name.split(".")[1]
            assert target == layer or target in ALLOWED[layer], (
                f"{path.relative_to(ROOT.parent)} imports {name}"
            )


def test_harness_imports_torch_and_engine_only_lazily():
    """`llmbench report/compare` must run without torch: no module-level heavy imports."""
    for path in _modules("harness"):
        if str(path.relative_to(ROOT)) in ENGINE_SIDE:
            continue
        for name in _imports(ast.parse(path.read_text()), top_level_only=True):
            assert not name.startswith(HEAVY), f"{path.relative_to(ROOT.parent)} imports {name}"


def test_reports_never_import_torch_or_the_engine():
    """Reports render from results files alone, on a laptop without torch."""
    for path in _modules("reports"):
        for name in _imports(ast.parse(path.read_text()), top_level_only=False):
            assert not name.startswith(HEAVY), f"{path.relative_to(ROOT.parent)} imports {name}"
            assert not name.startswith(("llmbench.harness.backends", "llmbench.harness.run")), (
                f"{path.relative_to(ROOT.parent)} imports {name}"
            )


def test_kernels_import_nothing_from_llmbench():
    """Layer 0: its modules import one another, nothing else of llmbench (not even errors)."""
    for path in _modules("kernels") if (ROOT / "kernels").is_dir() else []:
        for name in _imports(ast.parse(path.read_text()), top_level_only=False):
            is_own = name.startswith("llmbench.kernels.") or name == "llmbench.kernels"
            assert is_own or not name.startswith("llmbench"), f"{path} imports {name}"


def test_every_package_is_a_layer_with_rules():
    """A new top-level package must be given its place in ALLOWED (workloads/ holds only data)."""
    packages = {p.name for p in ROOT.iterdir() if (p / "__init__.py").is_file()}
    assert packages - {"workloads"} <= set(ALLOWED)
