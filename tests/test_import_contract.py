"""facetrain's import contract (tools/import_contract.py) holds on the tree, and catches what it is for:
an upward import at module level, inside a function or for a type checker, a `"module:attr"` string,
siblings of one layer importing each other, a lazy import outside cli/, and a cycle.

The contract's own rules and layers are in its docstring; `make lint` runs it too.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _load_contract():
    """tools/ is no package, so the script is loaded from its file (any working directory works)."""
    spec = importlib.util.spec_from_file_location("import_contract", REPO / "tools" / "import_contract.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


contract = _load_contract()


def without_lines(problems: list[str]) -> set[str]:
    """The violations without their line numbers, which every edit above them moves."""
    return {re.sub(r"^([\w.]+):\d+: ", r"\1: ", problem) for problem in problems}


@pytest.fixture(scope="module")
def tree() -> dict[str, str]:
    return contract.read_sources(REPO)


def test_the_tree_keeps_the_contract(tree):
    assert sorted(without_lines(contract.violations(tree))) == []


def test_every_package_has_a_layer(tree):
    assert {contract.package_of(module) for module in tree} <= {
        name for layer in contract.LAYERS for name in layer
    }


def with_module(tree: dict[str, str], name: str, text: str) -> set[str]:
    """The violations the tree would have with one more module, `name`, holding `text`."""
    before = without_lines(contract.violations(tree))
    return without_lines(contract.violations({**tree, name: text})) - before


def test_an_upward_import_at_module_level_is_caught(tree):
    added = with_module(tree, "facetrain.heads.upward", "from facetrain.train.trainer import train\n")
    assert added == {
        "facetrain.heads.upward: module import of facetrain.train.trainer: layer 1 imports layer 3 (upward)"
    }


def test_an_upward_import_inside_a_function_is_caught_twice(tree):
    text = "def build():\n    import facetrain.parallel.dims\n"
    added = with_module(tree, "facetrain.heads.upward", text)
    assert added == {
        "facetrain.heads.upward: lazy import of facetrain.parallel.dims: layer 1 imports layer 2 (upward)",
        "facetrain.heads.upward: lazy import of facetrain.parallel.dims: lazy imports belong to cli/ only; "
        "import it at module level",
    }


def test_a_downward_lazy_import_outside_the_cli_is_caught(tree):
    text = "class Thing:\n    def make(self):\n        from facetrain.errors import FacetrainError\n"
    added = with_module(tree, "facetrain.train.lazy", text)
    assert added == {
        "facetrain.train.lazy: lazy import of facetrain.errors: lazy imports belong to cli/ only; "
        "import it at module level"
    }


def test_the_cli_may_import_lazily_but_not_be_imported(tree):
    assert (
        with_module(tree, "facetrain.cli.fast", "def run():\n    from facetrain.train import trainer\n")
        == set()
    )
    added = with_module(tree, "facetrain.export.calls_cli", "from facetrain.cli import main\n")
    assert added == {
        "facetrain.export.calls_cli: module import of facetrain.cli: layer 3 imports layer 4 (upward)"
    }


def test_a_module_needing_an_optional_package_may_be_imported_lazily(tree):
    optional = {**tree, "facetrain.heads.kernel_x": "import triton\n"}
    added = with_module(
        optional, "facetrain.heads.user", "def ops():\n    from facetrain.heads import kernel_x\n"
    )
    assert added == set()


def test_type_checking_relative_and_string_imports_count(tree):
    text = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from ..checkpoint import reader\n"
        "OPTIMIZERS = {'sgd': 'facetrain.train.optim:build_optimizer'}\n"
    )
    added = with_module(tree, "facetrain.models.upward", text)
    assert added == {
        "facetrain.models.upward: type-checking import of facetrain.checkpoint.reader: layer 1 imports layer 2 "
        "(upward)",
        "facetrain.models.upward: string import of facetrain.train.optim: layer 1 imports layer 3 (upward)",
    }


def test_siblings_of_one_layer_may_not_import_each_other(tree):
    added = with_module(tree, "facetrain.eval.sibling", "from facetrain.heads import MarginHead\n")
    assert added == {
        "facetrain.eval.sibling: module import of facetrain.heads: eval and heads share layer 1 (siblings)"
    }


def test_a_cycle_is_caught_inside_one_package(tree):
    looped = {**tree, "facetrain.heads.first": "from facetrain.heads import second\n"}
    added = with_module(
        looped, "facetrain.heads.second", "def back():\n    return 1\nfrom facetrain.heads import first\n"
    )
    assert added == {"cycle: facetrain.heads.first -> facetrain.heads.second"}


def test_the_script_prints_each_violation_and_fails(tmp_path):
    package = tmp_path / "facetrain"
    (package / "heads").mkdir(parents=True)
    (package / "train").mkdir()
    (package / "__init__.py").write_text("")
    (package / "errors.py").write_text("")
    (package / "train" / "__init__.py").write_text("from facetrain.errors import *\n")
    (package / "heads" / "__init__.py").write_text("from facetrain.errors import *\n")
    script = [sys.executable, str(REPO / "tools" / "import_contract.py"), str(tmp_path)]
    clean = subprocess.run(script, capture_output=True, text=True, timeout=60)
    assert clean.returncode == 0, clean.stdout + clean.stderr
    assert clean.stdout == ""
    (package / "heads" / "upward.py").write_text("from facetrain.train import *\n")
    broken = subprocess.run(script, capture_output=True, text=True, timeout=60)
    assert broken.returncode == 1
    assert broken.stdout == (
        "facetrain.heads.upward:1: module import of facetrain.train: layer 1 imports layer 3 (upward)\n"
    )
    assert "1 violations (0 cycles)" in broken.stderr


def test_the_head_is_a_library():
    """`import facetrain.heads` loads the head's own modules and layer 0, nothing of the application."""
    code = "import facetrain.heads, sys; print(sorted(m for m in sys.modules if m.startswith('facetrain')))"
    environment = {**os.environ, "PYTHONPATH": str(REPO)}
    output = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=environment, check=True
    ).stdout
    loaded = eval(output)  # a printed list of module names
    foreign = [m for m in loaded if not m.startswith("facetrain.heads") and contract.layer_of(m) != 0]
    assert "facetrain.heads.sharded" in loaded
    assert foreign == []
