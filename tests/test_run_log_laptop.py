"""A one-process run on a laptop (`facetrain train -c CONFIG`, in this process) leaves a `train.log`
that reads like its terminal: the start header, the start-up lines, progress lines and the end."""

from __future__ import annotations

import re
import sys

from click.testing import CliRunner

from facetrain import progress, run_log
from facetrain.cli import main
from tests.support.train_helpers import tiny_config


def test_a_laptop_run_leaves_a_readable_train_log(tmp_path, monkeypatch):
    config = tiny_config(tmp_path, train={"steps": 4, "log_every": 2})
    monkeypatch.setattr(progress, "LINE_EVERY_S", 0.0)  # a progress line each step, not each 30 s
    monkeypatch.setattr(sys, "argv", ["facetrain", "train", "-c", str(config)])
    result = CliRunner().invoke(main, ["train", "-c", str(config)])
    assert result.exit_code == 0, result.output[-3000:]
    run_dir = tmp_path / "run"
    stamped = (run_dir / run_log.LOG_NAME).read_text().splitlines()
    assert all(re.match(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d ", line) for line in stamped)
    lines = [line.split(" ", 2)[2] for line in stamped]
    assert lines[0].startswith("=== facetrain train: started, world size 1, host ")
    assert lines[0].endswith(f"; command: facetrain train -c {config}")
    assert sum(line.startswith("=== ") for line in lines) == 1
    assert f"generating the synthetic face set in {tmp_path / 'synth'} (data.synth)" in lines
    assert any(line.startswith("head: ") for line in lines)
    steps = [int(m[1]) for line in lines if (m := re.match(r"train: +\d+% (\d)/4 \[", line))]
    assert steps[-1] == 4 and len(set(steps)) >= 2, lines
    assert "loss=" in next(line for line in lines if line.startswith("train: 100% 4/4"))
    assert (
        lines[-1]
        == f"done: 4 steps; checkpoints in {run_dir / 'checkpoints'}, curves in {run_dir / 'curves.png'}"
    )
    assert list((run_dir / "tensorboard").glob("events.out.tfevents.*"))  # tensorboard is in the app extra
