"""`--help` of every command stays free of torch and the other heavy imports, so it answers at once.

Importing torch costs seconds (tens of seconds on a loaded machine); help and the command tree must
not pay it. Commands are found by walking the click group, so a new command is covered as it lands.
The checks run in fresh interpreters: the test process itself has long imported torch.
"""

from __future__ import annotations

import json
import subprocess
import sys

import click

HEAVY = ("torch", "torchvision", "cv2", "numpy", "pandas", "matplotlib", "onnx", "dlib", "sklearn")

# Benchmarks whose click commands are defined beside the torch code they time (facetrain/bench/*.py):
# their own --help imports torch until the option definitions move to a light module.
HEAVY_HELP: set[tuple[str, ...]] = set()  # every command's --help is light now

WALK = """
import json, sys
from click.testing import CliRunner
from facetrain.cli import main

heavy, skip = json.loads(sys.argv[1]), {tuple(path) for path in json.loads(sys.argv[2])}
report = {}

def resolve(path):
    command, ctx = main, None
    for name in path:
        ctx = __import__("click").Context(command, parent=ctx)
        command = command.get_command(ctx, name)
    return command

def walk(path):
    result = CliRunner().invoke(main, [*path, "--help"])
    report[" ".join(path)] = {
        "exit_code": result.exit_code,
        "usage": result.output.startswith("Usage:"),
        "heavy": [name for name in heavy if name in sys.modules],
    }
    command = resolve(path)
    if hasattr(command, "list_commands"):
        for name in command.list_commands(None):
            if (*path, name) not in skip:
                walk([*path, name])

walk([])
print(json.dumps(report))
"""


def _run(script: str, *args: str) -> str:
    result = subprocess.run(
        [sys.executable, "-c", script, *args], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_import_of_the_cli_imports_nothing_heavy():
    loaded = _run(f"import sys, facetrain.cli; print([m for m in {HEAVY!r} if m in sys.modules])")
    assert loaded.strip() == "[]"


def test_help_of_every_command_imports_nothing_heavy():
    report = json.loads(_run(WALK, json.dumps(HEAVY), json.dumps(sorted(HEAVY_HELP))))
    from facetrain.cli import COMMANDS

    assert set(COMMANDS) <= set(report), "the walk missed top-level commands"
    assert {"data", "pairs", "import insightface", "import dlib", "bench", "bench head"} <= set(report)
    for path, outcome in report.items():
        assert outcome["exit_code"] == 0 and outcome["usage"], f"facetrain {path} --help failed"
        assert outcome["heavy"] == [], f"facetrain {path} --help imported {outcome['heavy']}"


def _lazy_groups(group: click.Group, ctx: click.Context | None = None):
    ctx = click.Context(group, parent=ctx)
    if hasattr(group, "lazy_commands"):
        yield group, ctx
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        if isinstance(command, click.Group):
            yield from _lazy_groups(command, ctx)


def test_short_help_read_from_source_matches_the_imported_command():
    from facetrain.cli import main
    from facetrain.cli.short_help import lazy_short_help

    groups = list(_lazy_groups(main))
    assert len(groups) >= 2
    for group, ctx in groups:
        for name, target in group.lazy_commands.items():
            command = group.get_command(ctx, name)
            for limit in (45, 80):
                expected = (command.get_short_help_str(limit), command.hidden)
                assert lazy_short_help(target, limit) == expected, f"{name} ({target})"
