"""A resume that reshapes the lr schedule says so in one line; a warmup as long as the run is warned
about; the under-fit check leaves runs too short to judge alone."""

from __future__ import annotations

from click.testing import CliRunner

from facetrain.cli import main
from facetrain.train.metrics import UnderfitWatch
from tests.support.train_helpers import tiny_config


def _train(*args: str) -> list[str]:
    result = CliRunner().invoke(main, ["train", "-q", *args])
    assert result.exit_code == 0, result.output
    return result.output.splitlines()


def test_a_warmup_as_long_as_the_run_is_warned_and_a_reshaping_resume_noted(tmp_path, one_thread):
    optim = {"lr": 0.05, "schedule": "polynomial", "warmup_steps": 4}
    config = str(tiny_config(tmp_path, optim=optim, train={"steps": 4}, checkpoint={"every": 4}))
    lines = _train("-c", config)
    warnings = [line for line in lines if line.startswith("warning:")]
    assert warnings == [
        "warning: optim.warmup_steps=4 >= train.steps=4: the lr only rises and never decays, ending at "
        "0.05; lower optim.warmup_steps (a tenth of train.steps is usual)"
    ]  # and no under-fit warning: 4 steps are too few to judge a recipe by

    lines = _train(
        "-c", config, "--resume", "auto", "--set", "train.steps=8", "--set", "optim.warmup_steps=1"
    )
    notes = [line for line in lines if "lr schedule" in line]
    assert notes == [
        "note: resuming reshapes the lr schedule (train.steps 4 -> 8, optim.warmup_steps 4 -> 1): "
        "lr at step 4 0.05 -> 0.0163"
    ]
    assert not [line for line in lines if line.startswith("warning:")]


def test_a_resume_that_keeps_the_lr_says_nothing(tmp_path, one_thread):
    config = str(tiny_config(tmp_path, train={"steps": 2}, checkpoint={"every": 2}))  # constant schedule
    _train("-c", config)
    lines = _train("-c", config, "--resume", "auto", "--set", "train.steps=3")
    assert not [line for line in lines if "lr schedule" in line]


def test_the_underfit_check_waits_for_the_warmup_and_skips_runs_too_short_to_judge():
    short = UnderfitWatch(total_steps=6, num_classes=12)
    assert all(short.check(step, 0.0) is None for step in range(1, 7))  # "2 of 6 steps" was noise
    warming = UnderfitWatch(total_steps=1000, num_classes=100, warmup_steps=500)
    assert warming.check(300, 0.0) is None  # 30 % of the schedule, but the lr is still rising
    assert "after 500 of 1000 steps" in warming.check(500, 0.0)
