"""Checkpoints given to `--resume`, `--init` and `export` that do not fit or are damaged: one line, or a
warning and a run that goes on, never a traceback. The real CLI on a finished 2-step run."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from facetrain.checkpoint import find_resume_point, stored
from tests.support.fault_helpers import error_lines
from tests.support.train_helpers import run_cli, tiny_config


def copied_checkpoint(finished_run: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "step_00000002"
    shutil.copytree(find_resume_point(finished_run / "run")[0], copy)
    return copy


def test_resuming_with_another_optimizer_starts_its_state_fresh_with_a_warning(finished_run, tmp_path):
    shutil.copytree(finished_run, tmp_path, dirs_exist_ok=True)
    config = tmp_path / "run.yaml"
    config.write_text(config.read_text().replace(str(finished_run), str(tmp_path)))
    checkpoint = tmp_path / "run" / "checkpoints" / "step_00000002"
    result = run_cli(
        "train", "-c", str(config), "--resume", "auto", "--set", "optim.name=adamw", "--set", "train.steps=3"
    )
    assert result.returncode == 0, result.stderr
    assert (
        f"warning: checkpoint {checkpoint} was trained with optim.name=sgd, this run uses adamw: sgd's state "
        "cannot seed adamw's, so adamw starts with fresh state; the weights, step 2 and the schedule carry on"
    ) in result.stdout
    assert f"resumed from {checkpoint} at step 2" in result.stdout
    keys = stored(find_resume_point(tmp_path / "run")[0])
    assert any(key.endswith(".exp_avg") for key in keys)
    assert not any(key.endswith(".momentum_buffer") for key in keys)


def test_resuming_past_train_steps_says_there_is_nothing_left_to_train(finished_run, tmp_path):
    shutil.copytree(finished_run, tmp_path, dirs_exist_ok=True)
    config = tmp_path / "run.yaml"
    config.write_text(config.read_text().replace(str(finished_run), str(tmp_path)))
    result = run_cli("train", "-c", str(config), "--resume", "auto", "--set", "train.steps=1")
    assert result.returncode == 0, result.stderr
    assert (
        "note: the checkpoint's step 2 is past train.steps=1, so there is nothing left to train; "
        "raise train.steps above 2 to train on"
    ) in result.stdout


@pytest.mark.parametrize(
    "name, damage, reason",
    [
        ("meta.json", "{cut sh", "not valid json: Expecting property name enclosed in double quotes"),
        ("config.yaml", "model: [r50\n", "not valid yaml line 2: expected"),
        ("config.yaml", None, "No such file or directory"),
    ],
    ids=["meta.json cut short", "config.yaml cut short", "config.yaml missing"],
)
def test_a_damaged_checkpoint_for_init_or_export_is_one_line(finished_run, tmp_path, name, damage, reason):
    checkpoint = copied_checkpoint(finished_run, tmp_path)
    if damage is None:
        (checkpoint / name).unlink()
    else:
        (checkpoint / name).write_text(damage)
    said = f"checkpoint {checkpoint} is damaged: {checkpoint / name} is missing or unreadable ({reason}"
    export = run_cli("export", str(checkpoint), "-o", str(tmp_path / "export"), "--quiet")
    [line] = error_lines(export.stderr)
    assert export.returncode == 2 and line.startswith(f"error: {said}"), line
    assert line.endswith("; use another checkpoint")
    assert not (tmp_path / "export").exists()

    config = tiny_config(tmp_path, "init", data={"path": str(finished_run / "synth")}, train={"steps": 1})
    init = run_cli("train", "-c", str(config), "--init", str(checkpoint))
    lines = [line for line in error_lines(init.stderr) if line.startswith("error:")]
    assert init.returncode == 2 and lines[0].startswith(f"error: model.init: {said}"), init.stderr
    assert len(lines) == 1 and "cannot write" not in init.stderr
