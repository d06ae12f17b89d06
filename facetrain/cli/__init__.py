"""The `facetrain` command line.

Subcommands live in their own modules and are imported only when invoked, so `facetrain --help`
stays fast and a broken optional dependency of one command never breaks the others.
"""

from __future__ import annotations

import errno
import importlib
import os
import sys

import click

from facetrain.cli.short_help import lazy_short_help
from facetrain.errors import EveryRankError, FacetrainError, PeerFailed, PeerLost

# name -> "module:attribute" of the click command, in the order of the work, which `--help` keeps:
# make or prepare data, train, evaluate, ship and use the model, bring one in, measure, then the tools
COMMANDS = {
    "synth": "facetrain.cli.data_cmd:synth",
    "data": "facetrain.cli.data_cmd:data",
    "align": "facetrain.cli.align_cmd:align",
    "pack": "facetrain.cli.pack_cmd:pack",
    "pairs": "facetrain.cli.pairs_cmd:pairs",
    "train": "facetrain.cli.train_cmd:train",
    "eval": "facetrain.cli.eval_cmd:eval_command",
    "export": "facetrain.cli.export_cmd:export",
    "embed": "facetrain.cli.export_cmd:embed",
    "compare": "facetrain.cli.export_cmd:compare",
    "import": "facetrain.cli.import_cmd:import_group",
    "bench": "facetrain.cli.bench_cmd:bench",
    "config": "facetrain.cli.config_cmd:config",
    "plot": "facetrain.cli.plot_cmd:plot",
}


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


# What the machine, not facetrain, refused: a full disk, a read-only or unwritable folder, a name the
# file system cannot hold. Any command can meet them on any file; each is a line naming the file.
ENVIRONMENT_ADVICE = {
    errno.ENOSPC: "free space, then run it again",
    errno.EDQUOT: "free space within your quota, then run it again",
    errno.EFBIG: "the file system cannot hold a file this big; choose another place",
    errno.EROFS: "choose a writable place",
    errno.EACCES: "check its permissions, or choose another place",
    errno.EPERM: "check its permissions, or choose another place",
    errno.ENAMETOOLONG: "choose a shorter name",
    errno.ELOOP: "fix or remove the symlink",
    errno.EIO: "the disk reported an error; check it",
}


def environment_error_line(error: OSError) -> str | None:
    """One line for an OSError of ENVIRONMENT_ADVICE's kinds, or None for any other (a bug to show)."""
    advice = ENVIRONMENT_ADVICE.get(error.errno)
    if advice is None:
        return None
    where = f"{error.filename}: " if error.filename else ""
    return f"{where}{error.strerror or os.strerror(error.errno)}; {advice}"


def report_user_error(error: FacetrainError) -> int:
    """Report a user error as one line; return the exit code 2.

    Printed once for errors every rank sees alike, never for a rank that only stopped because another
    failed, and not at all by ranks of a `--nproc` run, whose launcher prints the first cause last.
    Each rank also records it for the launcher or torchrun (`facetrain.parallel.launch`).
    """
    rank = os.environ.get("RANK", "0")
    if isinstance(error, (PeerFailed, PeerLost)):
        kind = "peer"
    elif isinstance(error, EveryRankError):
        kind = "every_rank"
    else:
        kind = "cause"
    if "TORCHELASTIC_ERROR_FILE" in os.environ:
        from facetrain.parallel.launch import launched_locally, record_failure

        record_failure(str(error), kind)
        if launched_locally():
            return 2
    if isinstance(error, PeerFailed) or (rank != "0" and kind == "every_rank"):
        return 2  # the rank that failed, or rank 0, prints it
    prefix = f"[rank {rank}] " if rank != "0" else ""
    fresh_line = "\n" if rank != "0" and sys.stderr.isatty() else ""  # rank 0's progress bar may be mid-line
    click.echo(f"{fresh_line}{prefix}error: {error}", err=True)
    return 2


@click.group(
    cls=LazyGroup,
    lazy_commands=COMMANDS,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
)
@click.version_option(package_name="facetrain")
def main() -> None:
    """facetrain: train face recognition and re-id models whose classifier is sharded over ranks.

    Inputs are positional, a model first (eval, export, embed, compare: MODEL); what a command
    writes goes to -o/--out; -q/--quiet turns off progress bars (docs/cli.md).

    \b
    Examples:
      facetrain synth -o data/synth                   # make the built-in dataset
      facetrain train -c configs/demo.yaml --nproc 2  # train on 2 CPU processes
      facetrain eval runs/demo/checkpoints/last --pairs data/synth/heldout/pairs.txt
      facetrain export runs/demo/checkpoints/best -o runs/demo/export
      facetrain compare runs/demo/export a.png b.png
    """
