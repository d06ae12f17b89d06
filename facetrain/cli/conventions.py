"""What every command spells alike, and the spellings of the last release that still work for this one.

The convention (docs/cli.md): what a command reads is positional, the model first (`eval`, `export`,
`embed` and `compare` take MODEL, then what it is applied to); what a command writes is `-o/--out`;
`-q/--quiet` turns off progress bars; a command does one thing, so there are no groups of one verb.
An old spelling is rewritten to the new one before click parses it, with a one-line notice on stderr,
so scripts keep working for one release and say what to change.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path

import click

from facetrain.logger import logger

Upgrade = Callable[[list[str]], list[str]]


def _silence_progress(ctx: click.Context, _param: click.Parameter, quiet: bool) -> None:
    """Turn off every progress bar of this command and of the processes it starts, until it ends."""
    if not quiet:
        return
    from facetrain.progress import QUIET_ENV

    before = os.environ.get(QUIET_ENV)
    os.environ[QUIET_ENV] = "1"

    def restore() -> None:
        if before is None:
            os.environ.pop(QUIET_ENV, None)
        else:
            os.environ[QUIET_ENV] = before

    ctx.call_on_close(restore)


quiet_option = click.option(
    "-q",
    "--quiet",
    is_flag=True,
    expose_value=False,
    callback=_silence_progress,
    help="No progress bars or progress lines (results, notices and errors still print).",
)


# the options of every command that embeds images with a model (eval, embed, compare, outliers)
device_option = click.option(
    "--device", default=None, help="cpu, cuda or cuda:N (default: cuda when available, else cpu)."
)
workers_option = click.option(
    "--workers", type=click.IntRange(min=0), default=0, show_default=True, help="Image decoding processes."
)

# train's and config's -c: a recipe by name (facetrain.config.recipes) or a YAML file
config_option = click.option(
    "-c",
    "--config",
    "config_path",
    type=click.Path(dir_okay=False),
    metavar="NAME|FILE",
    help="A recipe's name (`facetrain config --recipes`; in a clone, configs/NAME.yaml) or a YAML file; "
    "without one, the defaults (r50, GPU-sized).",
)


def batch_size_option(default: int = 128) -> Callable:
    return click.option(
        "--batch-size",
        type=click.IntRange(min=1),
        default=default,
        show_default=True,
        help="Images per batch.",
    )


trust_torchscript_option = click.option(
    "--trust-torchscript",
    is_flag=True,
    help="Let MODEL be TorchScript (a .pt, or an export with no model.safetensors). TorchScript is a "
    "program: loading it runs the code it holds, which can read and write your files, so pass this only "
    "for a file you trust; without it only weights (safetensors, checkpoints) are loaded.",
)


def checked_output(_ctx: click.Context, param: click.Parameter, value: Path | None) -> Path | None:
    """The callback of every `-o/--out`: a path no command can write to (a symlink to nothing, a name
    over 255 bytes) is one line before anything runs, instead of a traceback after the work."""
    from facetrain.files import check_output_path

    if value is not None:
        check_output_path(Path(value), param.opts[0])
    return value


def old_spelling_notice(old: str, new: str) -> None:
    logger.warning(f"note: {old} is the old spelling, kept for this release only; write {new}")


class OldSpellings(click.Command):
    """A command that still accepts last release's spellings, rewritten by `upgrades` before parsing."""

    def __init__(self, *args, upgrades: Sequence[Upgrade] = (), **kwargs):
        super().__init__(*args, **kwargs)
        self.upgrades = tuple(upgrades)

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        for upgrade in self.upgrades:
            args = upgrade(list(args))
        return super().parse_args(ctx, args)


def model_option_first(command: str, usage: str) -> Upgrade:
    """`-m/--model MODEL` anywhere in the arguments (embed and compare until now) becomes the first one."""

    def upgrade(args: list[str]) -> list[str]:
        for index, word in enumerate(args):
            if word == "--":
                break
            if word in ("-m", "--model") and index + 1 < len(args):
                model, rest = args[index + 1], args[:index] + args[index + 2 :]
            elif word.startswith("--model="):
                model, rest = word.partition("=")[2], args[:index] + args[index + 1 :]
            elif word.startswith("-m") and len(word) > 2:
                model, rest = word[2:], args[:index] + args[index + 1 :]
            else:
                continue
            old_spelling_notice(f"`facetrain {command} ... -m MODEL`", f"`facetrain {command} {usage}`")
            return [model, *rest]
        return args

    return upgrade


def dropped_verb(command: str, verb: str) -> Upgrade:
    """`COMMAND VERB ...` from when COMMAND was a group of that one verb is `COMMAND ...` now (unless a
    file or folder named VERB is there: then VERB is what the user means)."""

    def upgrade(args: list[str]) -> list[str]:
        if args and args[0] == verb and not os.path.exists(verb):
            old_spelling_notice(f"`facetrain {command} {verb}`", f"`facetrain {command}`")
            return args[1:]
        return args

    return upgrade


class UnlistedArgument(click.Argument):
    """A positional argument of an old spelling: still parsed, left out of the usage line and help."""

    def get_usage_pieces(self, ctx: click.Context) -> list[str]:
        return []

    def get_help_record(self, ctx: click.Context) -> None:
        return None


def old_positional_out(name: str) -> Callable:
    """The positional output of an old spelling (`synth OUT`, `align SRC DST`), now `-o/--out`."""
    return click.argument(name, cls=UnlistedArgument, required=False, type=click.Path(path_type=Path))


def out_or_old_positional(out: Path | None, positional: Path | None, command: str, usage: str) -> Path:
    """The output folder from `-o/--out`, or from last release's positional spelling with a notice."""
    if positional is None:
        if out is None:
            raise click.UsageError("Missing option '-o' / '--out'.")
        return out
    if out is not None:
        raise click.UsageError(f"got both {positional} and -o {out}; give the output once, with -o")
    old_spelling_notice(f"the output as a positional argument of `facetrain {command}`", f"`{usage}`")
    return positional
