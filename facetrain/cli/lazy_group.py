"""The command groups of `facetrain` and `facetrain bench`: commands imported on first use, user
errors printed as one line."""

from __future__ import annotations

import importlib
import sys

import click

from facetrain.cli.short_help import lazy_short_help
from facetrain.cli.user_errors import environment_error_line, report_user_error
from facetrain.errors import FacetrainError


class LazyGroup(click.Group):
    """A group whose commands are imported on first use; user errors print as one line.

    Commands are listed in the order `lazy_commands` is written, not alphabetically: a newcomer reads
    `--help` top down as the steps of the work (any command added eagerly follows, sorted)."""

    def __init__(self, *args, lazy_commands: dict[str, str], **kwargs):
        super().__init__(*args, **kwargs)
        self.lazy_commands = lazy_commands

    def list_commands(self, ctx: click.Context) -> list[str]:
        eager = sorted(set(super().list_commands(ctx)) - set(self.lazy_commands))
        return [*self.lazy_commands, *eager]

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name in self.lazy_commands:
            module_name, attribute = self.lazy_commands[name].split(":")
            return getattr(importlib.import_module(module_name), attribute)
        return super().get_command(ctx, name)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """List the commands with short helps read from source, so `--help` imports none of them."""
        names = self.list_commands(ctx)
        if not names:
            return
        limit = formatter.width - 6 - max(len(name) for name in names)
        rows = []
        for name in names:
            listed = self._listed_help(ctx, name, limit)
            if listed is not None and not listed[1]:
                rows.append((name, listed[0]))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)

    def _listed_help(self, ctx: click.Context, name: str, limit: int) -> tuple[str, bool] | None:
        target = self.lazy_commands.get(name)
        if target is not None and target.split(":")[0] not in sys.modules:
            listed = lazy_short_help(target, limit)
            if listed is not None:
                return listed
        command = self.get_command(ctx, name)
        return None if command is None else (command.get_short_help_str(limit), command.hidden)

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except FacetrainError as error:
            sys.exit(report_user_error(error))
        except OSError as error:
            line = environment_error_line(error)
            if line is None:
                raise
            sys.exit(report_user_error(FacetrainError(line)))
