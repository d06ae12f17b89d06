"""No function of facetrain takes more than 8 parameters but click commands (one parameter an option; a
benchmark's `run`, which its command calls as `run(**options)` so that `--help` imports no torch, is
the command's body) and Triton kernels (one a tensor or a constexpr): related values travel as one
settings object (`EmbedSettings`, `AlignSettings`, `StepTiming`, `HeadPlan`), so a new setting is one
field, not a parameter on each function that passes it along.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "facetrain"
LIMIT = 8
CLI = PACKAGE / "cli"


def _command_bodies() -> set[str]:
    """`bench/<name>.py::run` for each benchmark a command of cli/ runs as `run(**options)`."""
    bodies = set()
    for path in CLI.glob("bench_*.py"):
        text = path.read_text()
        for node in ast.walk(ast.parse(text)):
            if (
                isinstance(node, ast.ImportFrom)
                and node.module
                and node.module.startswith("facetrain.bench.")
            ):
                if any(alias.name == "run" for alias in node.names) and "run(**options)" in text:
                    bodies.add(f"bench/{node.module.rpartition('.')[2]}.py::run")
    return bodies


def _exempt(function: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """A click command (its decorators name click, a command or an option) or a Triton kernel (jit)."""
    for decorator in function.decorator_list:
        name = ast.unparse(decorator.func if isinstance(decorator, ast.Call) else decorator)
        if name.startswith("click.") or name.endswith((".command", "jit")) or "option" in name:
            return True
    return False


def _functions(tree: ast.AST, prefix: str = ""):
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.ClassDef):
            yield from _functions(node, f"{prefix}{node.name}.")
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            yield f"{prefix}{node.name}", node
            yield from _functions(node, f"{prefix}{node.name}.")


def parameter_counts() -> dict[str, int]:
    """Each function over the limit (self and cls not counted) as `path::qualified name`: its count."""
    over, bodies = {}, _command_bodies()
    for path in sorted(PACKAGE.rglob("*.py")):
        for name, function in _functions(ast.parse(path.read_text())):
            arguments = function.args
            named = [a.arg for a in [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]]
            count = len([a for a in named if a not in ("self", "cls")])
            where = f"{path.relative_to(PACKAGE).as_posix()}::{name}"
            if count > LIMIT and not _exempt(function) and where not in bodies:
                over[where] = count
    return over


def test_no_function_takes_more_than_eight_parameters():
    over = parameter_counts()
    assert not over, f"{over}: group related parameters in one settings object (at most {LIMIT})"
