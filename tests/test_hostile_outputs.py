"""Output paths no command can write to (#38, medium): a symlink to nothing and names longer than the
system takes are one line before any work, with nothing created, where they were tracebacks (after
the whole evaluation, in eval), a `.NAME.synth-tmp` left behind (synth) or "File exists ... free space"
(train)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.support.fault_helpers import error_lines
from tests.support.hostile_helpers import one_line_error
from tests.support.train_helpers import run_cli

REPO = Path(__file__).resolve().parents[1]
COMMANDS = {
    "synth": lambda out, inputs: ["synth", "-o", out, "--identities", "2"],
    "align": lambda out, inputs: ["align", inputs, "-o", out],
    "pairs": lambda out, inputs: ["pairs", inputs, "-o", out],
    "eval": lambda out, inputs: ["eval", inputs / "model", "--folder", inputs, "-o", out],
    "export": lambda out, inputs: ["export", inputs / "model", "-o", out],
    "embed": lambda out, inputs: ["embed", inputs / "model", inputs, "-o", out],
    "import": lambda out, inputs: ["import", "insightface", inputs / "backbone.pth", "-o", out],
    "plot": lambda out, inputs: ["plot", inputs / "run", "-o", out],
    "train": lambda out, inputs: ["train", "-c", REPO / "configs" / "demo.yaml", "-o", out],
}


@pytest.mark.parametrize("command", COMMANDS)
def test_a_symlink_to_nothing_as_output_is_one_line(tmp_path: Path, command: str) -> None:
    inputs = tmp_path / "inputs"
    inputs.mkdir()
    out = tmp_path / "out"
    os.symlink(tmp_path / "nowhere" / "target", out)
    line = one_line_error(*COMMANDS[command](out, inputs))
    assert line == (
        f"error: -o {out} is a symlink to {tmp_path / 'nowhere' / 'target'}, which does not exist; remove the "
        "link or choose another -o"
    )
    assert sorted(path.name for path in tmp_path.iterdir()) == ["inputs", "out"]
    assert list(inputs.iterdir()) == []


@pytest.mark.parametrize("command", ["export", "embed", "train", "eval"])
@pytest.mark.parametrize("too_long", ["name", "path"])
def test_an_output_name_longer_than_the_system_takes_is_one_line(
    tmp_path: Path, command: str, too_long: str
) -> None:
    inputs = tmp_path / "inputs"
    inputs.mkdir()
    out = tmp_path / ("n" * 256) if too_long == "name" else tmp_path.joinpath(*["p" * 200] * 21)
    line = one_line_error(*COMMANDS[command](out, inputs))
    if too_long == "name":
        assert line.endswith(
            f"the name {'n' * 60}... is 256 bytes, more than the 255 a file name can have; choose a shorter one"
        )
    else:
        assert (
            f" is {len(os.fsencode(out))} bytes long, more than the 4095 a path can have; choose a shorter one"
            in line
        )
    assert len(line) < 300
    assert sorted(path.name for path in tmp_path.iterdir()) == ["inputs"]


def test_train_output_dir_from_the_config_is_checked_too(tmp_path: Path) -> None:
    out = tmp_path / "run"
    os.symlink(tmp_path / "nowhere", out)
    result = run_cli("train", "-c", str(REPO / "configs" / "demo.yaml"), "--set", f"train.output_dir={out}")
    assert result.returncode == 2
    assert error_lines(result.stderr) == [
        f"error: train.output_dir {out} is a symlink to {tmp_path / 'nowhere'}, which does not exist; remove "
        "the link or choose another train.output_dir"
    ]
    assert sorted(path.name for path in tmp_path.iterdir()) == ["run"]
