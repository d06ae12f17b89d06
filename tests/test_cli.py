"""Every command's --help shows examples; user errors are one line without a traceback."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from facetrain.cli import COMMANDS, main
from facetrain.cli.bench_cmd import BENCHMARKS

EVERY_COMMAND = (
    [[name] for name in COMMANDS] + [["bench", name] for name in BENCHMARKS] + [["import", "dlib"]]
)


@pytest.mark.parametrize("words", EVERY_COMMAND, ids=" ".join)
def test_help_shows_examples(words):
    result = CliRunner().invoke(main, [*words, "--help"])
    assert result.exit_code == 0, result.output
    assert "Examples:" in result.output and "facetrain " in result.output.split("Examples:")[1]


def test_config_error_is_one_line(tmp_path):
    config = tmp_path / "bad.yaml"
    config.write_text("train:\n  steps: [1, 2]\n")
    result = CliRunner().invoke(main, ["config", "-c", str(config)])
    assert result.exit_code == 2
    assert result.output.strip() == f"error: config {config}: train.steps must be an integer, got [1, 2]"
