"""The import graph keeps its layers: model and data code know nothing of processes, training code (and the
tests but the benchmarks') nothing of benchmarks, and no facetrain modules import each other in a cycle.

Module-level imports only (imports inside functions are deliberate late binding, e.g. the CLI's lazy
commands); followed transitively through facetrain's own modules.
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "facetrain"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(path): path for path in PACKAGE.rglob("*.py")}


def _top_level_imports(path: Path) -> set[str]:
    """Modules named by imports at module level (not inside functions or classes)."""
    names: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


@cache
def direct_imports(module: str) -> frozenset[str]:
    return frozenset(_top_level_imports(MODULES[module]))


def facetrain_edges(module: str, with_parents: bool = True) -> set[str]:
    """facetrain modules `module` imports; `with_parents`: also the packages whose __init__ that runs."""
    edges = set()
    for name in direct_imports(module):
        while name and name not in MODULES:
            name = name.rpartition(".")[0]
        if name.startswith("facetrain") and name != module:
            edges.add(name)
            parts = name.split(".")
            if with_parents:
                edges.update(".".join(parts[:i]) for i in range(1, len(parts)))
    edges.discard(module)
    return edges & MODULES.keys()


@cache
def reachable(module: str, with_parents: bool = True) -> frozenset[str]:
    seen, stack = set(), [module]
    while stack:
        for target in facetrain_edges(stack.pop(), with_parents):
            if target not in seen:
                seen.add(target)
                stack.append(target)
    return frozenset(seen)


def external_imports(module: str) -> set[str]:
    names = set(direct_imports(module))
    for other in reachable(module):
        names |= direct_imports(other)
    return names


@pytest.mark.parametrize("layer", ["facetrain.models", "facetrain.data"])
def test_model_and_data_code_never_reach_torch_distributed(layer):
    for module in (m for m in MODULES if m.startswith(layer)):
        bad = sorted(n for n in external_imports(module) if n.startswith("torch.distributed"))
        assert not bad, f"{module} imports {bad[0]}"
        parallel = sorted(m for m in reachable(module) if m.startswith("facetrain.parallel"))
        assert not parallel, f"{module} imports {parallel[0]}"


@pytest.mark.parametrize("layer", ["facetrain.heads", "facetrain.parallel", "facetrain.train"])
def test_training_code_imports_nothing_from_the_benchmarks(layer):
    for module in (m for m in MODULES if m.startswith(layer)):
        bench = sorted(m for m in reachable(module) if m.startswith("facetrain.bench"))
        assert not bench, f"{module} imports {bench[0]}"


def test_no_module_imports_itself_through_others():
    """A submodule starting its own package's __init__ is how packages work; any other loop is a cycle."""
    for module in MODULES:
        assert module not in reachable(module, with_parents=False), f"{module} is in an import cycle"


def _imports_anywhere(path: Path) -> set[str]:
    """Modules a file imports at any depth (in functions too)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.update({node.module, *(f"{node.module}.{alias.name}" for alias in node.names)})
    return names


def test_only_the_benchmarks_tests_import_benchmark_code():
    """The worker pool, the naive head, traffic counting and peak RSS live below bench/ (parallel/, heads/,
    process_memory), so a test of anything else needs no benchmark module; test support is tests/support/."""
    tests = Path(__file__).resolve().parent
    for path in sorted(tests.rglob("*.py")):
        if path.name.startswith("test_bench_"):
            continue
        bench = sorted(
            n for n in _imports_anywhere(path) if n == "facetrain.bench" or n.startswith("facetrain.bench.")
        )
        assert not bench, f"{path.relative_to(tests)} imports {bench[0]}"


def test_tests_share_helpers_through_tests_support_only():
    """A helper one test module imports from another drags that module's fixtures and imports along and
    hides where shared material lives: it belongs in tests/support/."""
    tests = Path(__file__).resolve().parent
    for path in sorted(tests.glob("test_*.py")):
        others = sorted(
            name
            for name in _imports_anywhere(path)
            if name.startswith("tests.test_") and name.split(".")[1] != path.stem
        )
        assert not others, f"{path.name} imports {others[0]}; move what it shares into tests/support/"
