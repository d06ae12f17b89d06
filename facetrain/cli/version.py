"""`facetrain --version`: the release, and in a checkout the commit, so a report names the code it ran."""

from __future__ import annotations

import subprocess
from pathlib import Path

import click


def version_line() -> str:
    """`facetrain VERSION`, with `(commit DESCRIPTION, checkout PATH)` when facetrain runs from a git
    checkout (a clone or an editable install) and git answers; an installed wheel has no commit."""
    import facetrain

    line = f"facetrain {facetrain.__version__}"
    checkout = Path(facetrain.__file__).resolve().parents[1]
    if not (checkout / ".git").exists():  # a folder in a clone, a file in a worktree
        return line
    try:
        described = subprocess.run(
            ["git", "-C", str(checkout), "describe", "--always", "--dirty", "--abbrev=12"],
            capture_output=True, text=True, timeout=10, check=True,
        ).stdout.strip()  # fmt: skip
    except (OSError, subprocess.SubprocessError):  # no git, or not a repository it can read
        return line
    return f"{line} (commit {described}, checkout {checkout})"


def show_version(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if value and not ctx.resilient_parsing:
        click.echo(version_line())
        ctx.exit()
