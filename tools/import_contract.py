"""facetrain's import contract: every arrow between its packages points down the layers, and no modules
import each other in a loop.

    python tools/import_contract.py          # prints each violation on a line; exit status 1 on any

| layer | packages                                                   | may import                       |
| ----- | ---------------------------------------------------------- | -------------------------------- |
| 0     | config, errors, registry, files, input_files, progress,    | layer 0 only                     |
|       | choices, devices, run_lock, logger, run_log, job_env,      |                                  |
|       | pixels, process_memory, output_lock, output_files,         |                                  |
|       | pickle_scan, facetrain                                     |                                  |
| 1     | heads, models, data, align, eval                           | layer 0; eval and align data     |
| 2     | parallel, checkpoint, interop                              | layers 0-1; interop checkpoint   |
| 3     | train, export                                              | layers 0-2                       |
| 4     | bench, cli, __main__ (the entry points)                    | layers 0-3; cli bench; __main__  |
|       |                                                            | cli                              |

Packages of one layer above 0 are independent of each other (the layer-0 modules are the shared ground
and may use each other). Nothing imports layer 4 but the entry points named in the last row.

Every way one module can reach another counts: imports at module level, inside functions (lazy) and under
`if TYPE_CHECKING:`, relative ones, `importlib.import_module("facetrain...")` and `"facetrain.pkg.mod:attr"`
strings that a registry or a config resolves. A lazy import of a facetrain module is itself a violation
outside cli/ and __main__, where it exists to keep the command line's start-up fast, unless the module
it imports needs an optional package (triton, dlib, onnx, ...) at its top. A cycle is any loop of two or
more modules over all of these arrows, inside one package too.
"""

from __future__ import annotations

import ast
import re
import sys
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

LAYERS: tuple[tuple[str, ...], ...] = (
    (
        "",
        "config",
        "errors",
        "registry",
        "files",
        "input_files",
        "progress",
        "choices",
        "devices",
        "run_lock",
        "logger",
        "run_log",
        "job_env",
        "pixels",
        "process_memory",
        "output_lock",
        "pickle_scan",
        "output_files",
    ),
    ("heads", "models", "data", "align", "eval"),
    ("parallel", "checkpoint", "interop"),
    ("train", "export"),
    ("bench", "cli", "__main__"),
)
# layer 0 is the common ground its modules share; above it a layer's packages are independent
SHARED_LAYERS = {0}
# the arrows a layer's packages may draw between them: eval/ and align/ read images through data/'s
# decoder (the one reader that checks an image before decoding it) and its eval transform, so data/ sits
# below them; the importers of interop/ write checkpoints and load_model reads them; the command line
# runs the benchmarks, `python -m facetrain` the command line
ALLOWED_SIBLINGS = {
    ("eval", "data"),
    ("align", "data"),
    ("interop", "checkpoint"),
    ("cli", "bench"),
    ("__main__", "cli"),
}
LAZY_ALLOWED = {"cli", "__main__"}
# third-party packages facetrain runs without: a module that needs one is imported lazily where used
OPTIONAL_PACKAGES = {
    "triton",
    "dlib",
    "onnx",
    "onnxruntime",
    "timm",
    "wandb",
    "mlflow",
    "face_recognition_models",
}

_MODULE_STRING = re.compile(r"facetrain(?:\.[A-Za-z_]\w*)*(?::[A-Za-z_][\w.]*)?")


@dataclass(frozen=True, order=True)
class Arrow:
    """One module reaching another; `how`: module, lazy, type-checking or string."""

    source: str
    target: str
    line: int
    how: str


def package_of(module: str) -> str:
    """The top-level part of facetrain a module belongs to: `facetrain.heads.sharded` -> heads."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def layer_of(module: str) -> int | None:
    package = package_of(module)
    return next((index for index, names in enumerate(LAYERS) if package in names), None)


def module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def read_sources(root: Path = ROOT) -> dict[str, str]:
    """facetrain's modules under `root` (the checkout): dotted name -> source text."""
    return {
        module_name(path, root): path.read_text()
        for path in sorted((root / "facetrain").rglob("*.py"))
        if "__pycache__" not in path.parts
    }


@cache
def _parse(source: str) -> ast.Module:
    """Each text is parsed once, however many graphs (the tests build several) it is part of."""
    return ast.parse(source)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _walk(node: ast.AST, how: str) -> Iterator[tuple[ast.AST, str]]:
    """Every node under `node`, each with how an import there would run: at module level, lazily inside
    a function, or only for a type checker."""
    for child in ast.iter_child_nodes(node):
        child_how = how
        if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) and how == "module":
            child_how = "lazy"
        yield child, child_how
        if isinstance(child, ast.If) and _is_type_checking(child.test):
            for part in child.body:
                yield part, "type-checking"
                yield from _walk(part, "type-checking")
            for part in child.orelse:
                yield part, child_how
                yield from _walk(part, child_how)
        else:
            yield from _walk(child, child_how)


def _resolve(name: str, modules: set[str]) -> str | None:
    """The facetrain module a dotted name lands in: itself, or the longest module it starts with."""
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]
    return None


@cache
def _named(source: str, package: str) -> tuple[tuple[str, str, int, str], ...]:
    """(dotted name, the name imported from it or "", line, how) of each import and each module string
    in `source`; relative imports start from `package`."""
    names = []
    for node, how in _walk(_parse(source), "module"):
        if isinstance(node, ast.Import):
            names += [(alias.name, "", node.lineno, how) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            names += [(base, alias.name, node.lineno, how) for alias in node.names]
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and _MODULE_STRING.fullmatch(node.value)
        ):
            names.append((node.value, "", node.lineno, "string"))
    return tuple(names)


def arrows_of(module: str, source: str, modules: Iterable[str]) -> list[Arrow]:
    """Every arrow out of `module` (its text `source`) into another of `modules`."""
    modules = set(modules)
    is_package = any(m.startswith(f"{module}.") for m in modules) or module == "facetrain"
    package = module if is_package else module.rpartition(".")[0]
    found = set()
    for base, member, line, how in _named(source, package):
        if how == "string":
            if ":" not in base and base not in modules:
                continue  # a plain dotted string that names no module: a logger's name, say
            name = base.partition(":")[0]
        else:
            full = f"{base}.{member}" if member else base
            name = full if full in modules else base
        target = _resolve(name, modules) if name.startswith("facetrain") else None
        if target is not None and target != module:
            found.add(Arrow(module, target, line, how))
    return sorted(found)


def all_arrows(sources: Mapping[str, str]) -> list[Arrow]:
    modules = set(sources)
    return [arrow for module, text in sources.items() for arrow in arrows_of(module, text, modules)]


def needs_optional_package(source: str) -> bool:
    """Whether a module imports one of OPTIONAL_PACKAGES at its top (so it may only be imported lazily)."""
    for node in _parse(source).body:
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names = [node.module]
        if any(name.partition(".")[0] in OPTIONAL_PACKAGES for name in names):
            return True
    return False


def layer_violations(arrows: Iterable[Arrow], optional: Iterable[str] = ()) -> list[str]:
    """The arrows that break the layers; `optional`: the modules that need an optional package."""
    problems, optional = [], set(optional)
    for arrow in arrows:
        source, target = package_of(arrow.source), package_of(arrow.target)
        where = f"{arrow.source}:{arrow.line}"
        what = f"{arrow.how} import of {arrow.target}"
        if arrow.how == "lazy" and source not in LAZY_ALLOWED and arrow.target not in optional:
            problems.append(f"{where}: {what}: lazy imports belong to cli/ only; import it at module level")
        if source == target:
            continue
        mine, theirs = layer_of(arrow.source), layer_of(arrow.target)
        if mine is None or theirs is None:
            unknown = source if mine is None else target
            problems.append(f"{where}: {what}: `{unknown}` is in no layer; add it to LAYERS")
        elif theirs > mine:
            problems.append(f"{where}: {what}: layer {mine} imports layer {theirs} (upward)")
        elif theirs == mine and mine not in SHARED_LAYERS and (source, target) not in ALLOWED_SIBLINGS:
            problems.append(f"{where}: {what}: {source} and {target} share layer {mine} (siblings)")
    return problems


def cycles(arrows: Iterable[Arrow]) -> list[list[str]]:
    """Each loop of modules (a strongly connected part of two or more), sorted; Tarjan's algorithm."""
    graph: dict[str, set[str]] = {}
    for arrow in arrows:
        graph.setdefault(arrow.source, set()).add(arrow.target)
        graph.setdefault(arrow.target, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(root: str) -> None:  # iterative, so deep graphs do not meet the recursion limit
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    part = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        part.append(member)
                        if member == node:
                            break
                    if len(part) > 1:
                        found.append(sorted(part))
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(graph[child]))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def violations(sources: Mapping[str, str]) -> list[str]:
    """Every breach of the contract in `sources` (dotted name -> text), one line each."""
    arrows = all_arrows(sources)
    optional = [module for module, text in sources.items() if needs_optional_package(text)]
    loops = [f"cycle: {' -> '.join(loop)}" for loop in cycles(arrows)]
    return sorted(layer_violations(arrows, optional)) + loops


def main(argv: list[str]) -> int:
    root = Path(argv[0]).resolve() if argv else ROOT
    problems = violations(read_sources(root))
    for problem in problems:
        print(problem)
    loops = sum(problem.startswith("cycle:") for problem in problems)
    print(f"{len(problems)} violations ({loops} cycles) in {root / 'facetrain'}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
