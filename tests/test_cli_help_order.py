"""`--help` is where a newcomer finds the way: commands in the order of the work, and `train --help`
naming the config's sections and the command that lists their keys."""

from __future__ import annotations

import dataclasses
import re

from click.testing import CliRunner

from facetrain.cli import main
from facetrain.train.run_config import Config

WORK_ORDER = [
    "synth",
    "data",
    "align",
    "pack",
    "pairs",
    "train",
    "eval",
    "outliers",
    "export",
    "embed",
    "compare",
    "import",
]


def _listed_commands(output: str) -> list[str]:
    listing = output.split("Commands:\n")[1]
    return [match.group(1) for match in re.finditer(r"^  (\S+)", listing, re.MULTILINE)]


def test_top_level_help_lists_commands_in_the_order_of_the_work():
    result = CliRunner().invoke(main, ["--help"])
    assert result.exit_code == 0, result.output
    listed = _listed_commands(result.output)
    assert listed[: len(WORK_ORDER) + 1] == [*WORK_ORDER, "bench"]
    assert sorted(listed[len(WORK_ORDER) + 1 :]) == ["config", "plot", "slurm-script"]


def test_train_help_names_the_sections_and_points_to_facetrain_config():
    result = CliRunner().invoke(main, ["train", "--help"])
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())  # help text is wrapped to the terminal
    assert "facetrain config" in text and "configs/demo.yaml" in text
    for section in dataclasses.fields(Config):
        assert re.search(rf"\b{section.name}\b", text.split("Examples:")[0]), section.name
