"""The one-line help of a lazy command, read from its module's source instead of importing it.

Listing a group's commands needs each command's short help; importing a command's module for it would
import torch and cost seconds per `--help`. Only plain `@click.command(...)`/`@group.command(...)`
functions with literal help texts are read this way; anything else returns None and the caller
imports the command as usual.
"""

from __future__ import annotations

import ast
import importlib.util
from functools import cache

import click

_TEXT_KEYWORDS = ("help", "short_help", "deprecated", "hidden")


@cache
def _function_decorators(module_name: str) -> dict[str, ast.FunctionDef]:
    spec = importlib.util.find_spec(module_name)
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return {}
    with open(spec.origin, encoding="utf-8") as source:
        tree = ast.parse(source.read(), spec.origin)
    return {node.name: node for node in tree.body if isinstance(node, ast.FunctionDef)}


def _command_keywords(function: ast.FunctionDef) -> dict[str, object] | None:
    """The literal help keywords of the function's command decorator; None when it has no plain one."""
    for decorator in function.decorator_list:
        if not isinstance(decorator, ast.Call):
            continue
        target = decorator.func
        name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")
        if name not in ("command", "group"):
            continue
        keywords = {}
        for keyword in decorator.keywords:
            if keyword.arg is None:
                return None
            if keyword.arg in _TEXT_KEYWORDS:
                if not isinstance(keyword.value, ast.Constant):
                    return None
                keywords[keyword.arg] = keyword.value.value
        return keywords
    return None


def lazy_short_help(target: str, limit: int) -> tuple[str, bool] | None:
    """(short help, hidden) of the command at "module:attribute", or None when it cannot be read."""
    module_name, attribute = target.split(":")
    function = _function_decorators(module_name).get(attribute)
    if function is None:
        return None
    keywords = _command_keywords(function)
    if keywords is None:
        return None
    keywords.setdefault("help", ast.get_docstring(function, clean=False))
    command = click.Command(attribute, **keywords)
    return command.get_short_help_str(limit), command.hidden
