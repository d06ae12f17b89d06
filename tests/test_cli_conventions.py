"""One spelling across commands (docs/cli.md), and last release's spellings still working with a notice.

The convention is checked by walking the command tree, so a new command is held to it as it lands:
MODEL first where a model is used, `-o/--out` for what a command writes, `-q/--quiet` where it shows
progress, no group of one verb.
"""

from __future__ import annotations

import re
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from facetrain.cli import main
from facetrain.cli.train_cmd import _resume_command
from facetrain.progress import QUIET_ENV
from tests.support.train_helpers import tiny_config

MODEL_COMMANDS = ("eval", "export", "embed", "compare")
# commands that show no progress bar, so have no -q/--quiet
WITHOUT_PROGRESS = {"compare", "config", "plot", "pairs", "bench train", "slurm-script"}
NOTICE = "is the old spelling, kept for this release only; write"


def every_command(group: click.Group = main, path: tuple[str, ...] = (), ctx: click.Context | None = None):
    ctx = click.Context(group, parent=ctx)
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        if isinstance(command, click.Group):
            yield from every_command(command, (*path, name), ctx)
        else:
            yield " ".join((*path, name)), command


COMMANDS = dict(every_command())


def options(command: click.Command) -> dict[str, click.Option]:
    return {name: param for param in command.params if isinstance(param, click.Option) for name in param.opts}


def invoke(*args) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, [str(arg) for arg in args])
    return result.exit_code, result.stdout, result.stderr


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_command_follows_the_convention(name):
    command = COMMANDS[name]
    named = options(command)
    if "--out" in named:
        assert "-o" in named["--out"].opts, f"facetrain {name}: --out without -o"
    assert "--output" not in named, f"facetrain {name}: the output option is -o/--out"
    if name in WITHOUT_PROGRESS:
        assert "--quiet" not in named
    else:
        assert named.get("--quiet") is not None and "-q" in named["--quiet"].opts, f"facetrain {name}: no -q"
    arguments = [param for param in command.params if isinstance(param, click.Argument)]
    if name.split()[0] in MODEL_COMMANDS:
        assert arguments[0].human_readable_name == "MODEL", f"facetrain {name}: MODEL is not first"
    assert "-m" not in named and "--model" not in named, f"facetrain {name}: the model is positional"


def test_no_group_has_a_single_verb():
    ctx = click.Context(main)
    groups = {name: main.get_command(ctx, name) for name in main.list_commands(ctx)}
    for name, group in groups.items():
        if isinstance(group, click.Group):
            assert len(group.list_commands(click.Context(group, parent=ctx))) > 1, name


def test_train_out_is_the_run_directory_and_quiet_drops_the_progress_line(tmp_path):
    config = tiny_config(tmp_path, "run", train={"steps": 2}, checkpoint={"every": 2})
    code, stdout, stderr = invoke("train", "-c", config, "-o", tmp_path / "elsewhere", "-q")
    assert code == 0, stderr
    assert (tmp_path / "elsewhere" / "checkpoints").is_dir() and not (tmp_path / "run").exists()
    assert "train: 100%" not in stdout + stderr and QUIET_ENV not in __import__("os").environ
    code, stdout, stderr = invoke("train", "-c", config, "-o", tmp_path / "a", "--set", "train.output_dir=b")
    assert code == 2 and "error: -o and --set train.output_dir both set train.output_dir; give one" in stderr
    words = _resume_command(str(config), ("train.steps=9",), str(tmp_path / "a"), 2).split()
    assert words[-6:] == ["-o", str(tmp_path / "a"), "--nproc", "2", "--resume", "auto"]


def test_quiet_turns_off_the_progress_line_of_a_command(tmp_path):
    small = ["--identities", 2, "--images-per-identity", 2, "--heldout-identities", 0, "--image-size", 8]
    code, stdout, stderr = invoke("synth", "-o", tmp_path / "loud", *small)
    assert code == 0 and "synth: 100%" in stderr
    code, stdout, stderr = invoke("synth", "-o", tmp_path / "quiet", *small, "-q")
    assert code == 0 and "synth" not in stderr and (tmp_path / "quiet" / "train").is_dir()


def test_old_positional_output_still_works_with_a_notice(tmp_path):
    small = ["--identities", 2, "--images-per-identity", 2, "--heldout-identities", 0, "--image-size", 8]
    code, stdout, stderr = invoke("synth", tmp_path / "old", *small, "-q")
    assert code == 0 and (tmp_path / "old" / "train").is_dir()
    assert stderr.strip() == f"note: the output as a positional argument of `facetrain synth` {NOTICE} " + (
        "`facetrain synth -o OUT`"
    )
    code, stdout, stderr = invoke("synth", tmp_path / "a", "-o", tmp_path / "b", *small)
    assert code == 2 and "give the output once, with -o" in stderr
    code, stdout, stderr = invoke("synth", *small)
    assert code == 2 and "Missing option '-o' / '--out'" in stderr
    code, stdout, stderr = invoke("align", tmp_path / "nowhere", tmp_path / "crops", "-q")
    assert stderr.splitlines()[0].startswith("note: the output as a positional argument of `facetrain align`")


def test_old_verbs_of_pairs_and_data_still_work_with_a_notice(tmp_path):
    code, stdout, stderr = invoke(
        "synth", "-o", tmp_path / "set", "--identities", 3, "--heldout-identities", 0, "-q"
    )
    faces = tmp_path / "set" / "train"
    code, new, _ = invoke("data", faces, "--workers", 1, "-q")
    code, old, stderr = invoke("data", "stats", faces, "--workers", 1, "-q")
    assert code == 0 and old == new and "identities" in new
    assert stderr.strip() == f"note: `facetrain data stats` {NOTICE} `facetrain data`"
    code, stdout, stderr = invoke("pairs", "make", faces, "-o", tmp_path / "pairs.csv")
    assert code == 0 and (tmp_path / "pairs.csv").is_file()
    assert stderr.strip() == f"note: `facetrain pairs make` {NOTICE} `facetrain pairs`"


def test_a_folder_named_like_an_old_verb_is_a_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, stdout, stderr = invoke("synth", "-o", "set", "--identities", 3, "--heldout-identities", 0, "-q")
    Path("set/train").rename("make")
    code, stdout, stderr = invoke("pairs", "make", "-o", "pairs.csv")
    assert code == 0 and stderr == "" and Path("pairs.csv").is_file()


def test_the_table_of_docs_cli_lists_every_command_with_its_options():
    """docs/cli.md's table: a row for every command, naming exactly the options it has."""
    text = (Path(__file__).resolve().parents[1] / "docs" / "cli.md").read_text().split("## Spellings")[0]
    rows = {}
    for line in text.splitlines():
        cells = (
            [cell.strip() for cell in line.strip("|").split("|")] if line.startswith("| `facetrain ") else []
        )
        if cells:
            rows[cells[0].strip("`").removeprefix("facetrain ")] = cells
    assert set(rows) == set(COMMANDS)
    for name, command in COMMANDS.items():
        reads, writes, others = rows[name][1], rows[name][2], " ".join(rows[name][3:])
        named = options(command)
        listed = {
            named[token].name for token in re.findall(r"`(--?[\w-]+)", f"{reads} {others}") if token in named
        }
        assert len(listed) == len(re.findall(r"`(--?[\w-]+)", f"{reads} {others}")), (
            f"{name}: an option it lacks"
        )
        if writes and writes != "(prints)":
            listed.add(named["--out"].name)
        expected = {
            param.name for param in command.params if isinstance(param, click.Option) and not param.hidden
        }
        assert listed == expected, name
