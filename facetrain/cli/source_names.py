"""The data sources `facetrain data --source` offers, read from the readers' source files.

The readers register themselves when `facetrain.data.sources` imports them, and importing them imports
torch, torchvision and cv2: seconds, for a `--help`. So the names are read from the text instead: the
modules `facetrain.data.sources` imports from, and in each the top-level `register_source("<name>",
DataSource(...))` calls. A source the run makes itself (`made_by_the_run=True`) is left out, as
`facetrain.data.source_record.inspectable_sources` leaves it out of the registry;
tests/test_data_sources.py holds the two lists equal.
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

import facetrain

SOURCES_MODULE = "facetrain.data.sources"


def _module_tree(module_name: str) -> ast.Module:
    """The parsed source of a facetrain module, found without importing it or its package
    (`importlib.util.find_spec` would import `facetrain.data`, and with it torch)."""
    path = Path(facetrain.__file__).parent.joinpath(*module_name.split(".")[1:]).with_suffix(".py")
    return ast.parse(path.read_text(encoding="utf-8"), str(path))


def _registrations(tree: ast.Module) -> list[str]:
    """The names of the module's top-level `register_source` calls, the run's own sources left out."""
    names = []
    for node in tree.body:
        call = node.value if isinstance(node, ast.Expr) else None
        if not (isinstance(call, ast.Call) and getattr(call.func, "id", None) == "register_source"):
            continue
        name, record = call.args
        made_by_the_run = any(
            keyword.arg == "made_by_the_run" and keyword.value.value is True
            for keyword in getattr(record, "keywords", ())
        )
        if not made_by_the_run:
            names.append(name.value)
    return names


@cache
def inspectable_source_names() -> tuple[str, ...]:
    """The user-readable sources, in the order `facetrain.data.sources` imports their readers."""
    readers = [
        node.module
        for node in _module_tree(SOURCES_MODULE).body
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("facetrain.data.")
    ]
    return tuple(name for module in readers for name in _registrations(_module_tree(module)))
