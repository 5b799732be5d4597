"""The import rules, checked on the source: a layer imports only the layers below it, and no
module reaches itself through imports — counting the imports inside functions, which hide a
circle from Python but not from a reader.

The order, lowest first:

    0  kernels    Triton kernels, the C++ CPU extension, what this CPU is
    1  engine     the inference engine and its async client
    2  roofline   roofs (measured, datasheet), cost model, analysis, what-if, per-op profile
    2  serve      the OpenAI-compatible server over the engine client
    3  harness    specs, workloads, load, driver, backends, metrics, results, runs
    4  compare    gates, verdicts, CI outputs
    5  reports    figures, HTML, Markdown — from results files alone
    5  ab         interleaved A/B runs: sides, builds of git refs, rounds
    6  cli        the commands
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "llmbench"

# What each layer may import from llmbench besides itself and the shared base modules.
ALLOWED = {
    "kernels": set(),
    "engine": {"kernels"},
    "roofline": {"engine", "kernels"},  # engine and torch only lazily (see below)
    "serve": {"engine", "kernels"},
    "harness": {"roofline", "engine", "kernels"},  # engine and torch only lazily
    "compare": {"harness", "roofline"},
    "reports": {"compare", "harness", "roofline"},
    "ab": {"compare", "harness", "roofline"},
    "cli": {"kernels", "engine", "roofline", "serve", "harness", "compare", "ab", "reports"},
}
BASE = {"llmbench", "llmbench.errors"}  # the version and the error types: every layer but kernels
HEAVY = ("torch", "llmbench.engine", "llmbench.kernels")
TORCH_FREE_KERNEL_MODULES = {"llmbench.kernels.cpu_info"}  # read /proc/cpuinfo, nothing else
# Modules of the torch-free layers that may import the engine at module level: they run it.
ENGINE_SIDE = {"harness/backends/engine.py"}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def _imports(path: Path, top_level_only: bool) -> list[str]:
    """The modules `path` imports (`from a.b import c` names a.b.c when that is a module)."""
    tree = ast.parse(path.read_text())
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    names = []
    for node in tree.body if top_level_only else ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the package, `level - 1` packages up
                parts = package.split(".")
                up = ".".join(parts[: len(parts) - node.level + 1])
                base = f"{up}.{base}" if base else up
            for alias in node.names:
                full = f"{base}.{alias.name}"
                names.append(full if full in MODULES else base)
    return names


def _layer(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "llmbench" else None


@pytest.mark.parametrize("layer", list(ALLOWED))
def test_layer_imports_only_what_it_may(layer):
    for path in sorted((ROOT / layer).rglob("*.py")):
        for name in _imports(path, top_level_only=False):
            if not name.startswith("llmbench") or (name in BASE and layer != "kernels"):
                continue
            target = _layer(name)
            assert target == layer or target in ALLOWED[layer], (
                f"{path.relative_to(ROOT.parent)} imports {name}"
            )


@pytest.mark.parametrize("layer", ["roofline", "harness", "compare"])
def test_torch_free_layers_import_torch_and_engine_only_lazily(layer):
    """`llmbench report/compare/roofline` run without torch: no module-level heavy imports."""
    for path in sorted((ROOT / layer).rglob("*.py")):
        if str(path.relative_to(ROOT)) in ENGINE_SIDE:
            continue
        for name in _imports(path, top_level_only=True):
            if name in TORCH_FREE_KERNEL_MODULES:
                continue
            assert not name.startswith(HEAVY), f"{path.relative_to(ROOT.parent)} imports {name}"


def test_reports_never_import_torch_the_engine_or_a_run():
    """Reports render from results files alone, on a laptop without torch."""
    for path in sorted((ROOT / "reports").rglob("*.py")):
        for name in _imports(path, top_level_only=False):
            assert not name.startswith(HEAVY), f"{path.relative_to(ROOT.parent)} imports {name}"
            assert not name.startswith(("llmbench.harness.backends", "llmbench.harness.run")), (
                f"{path.relative_to(ROOT.parent)} imports {name}"
            )


def test_kernels_import_nothing_from_llmbench():
    """Layer 0: its modules import one another, nothing else of llmbench (not even errors)."""
    for path in sorted((ROOT / "kernels").rglob("*.py")):
        for name in _imports(path, top_level_only=False):
            is_own = name.startswith("llmbench.kernels.") or name == "llmbench.kernels"
            assert is_own or not name.startswith("llmbench"), f"{path} imports {name}"


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _import_graph() -> dict[str, set[str]]:
    graph = {}
    for name, path in MODULES.items():
        targets = set()
        for target in _imports(path, top_level_only=False):
            while target and target not in MODULES:  # a name inside a module: the module
                target = target.rpartition(".")[0]
            if target and target != name:
                targets.add(target)
        graph[name] = targets
    return graph


def test_no_import_circles_counting_imports_inside_functions():
    circles = _circles(_import_graph())
    assert circles == [], "import circles: " + "; ".join(" <-> ".join(c) for c in circles)


def test_the_circle_finder_finds_a_circle_behind_a_function_level_import():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert _circles(graph) == [["a", "b", "c"]]
    assert _circles({"a": {"b"}, "b": set()}) == []


def test_every_package_is_a_layer_with_rules():
    """A new top-level package must be given its place in ALLOWED (workloads/ holds only data)."""
    packages = {p.name for p in ROOT.iterdir() if (p / "__init__.py").is_file()}
    assert packages - {"workloads"} == set(ALLOWED)
