"""The soak test: a 2-rank run of 120 steps killed with SIGKILL (every process at once, as a lost node
would be) at three seeded random points and resumed each time ends bit for bit where an uninterrupted
run ends. The kills land wherever the run is: mid-step, mid-checkpoint, during startup's resume.

It ran 240 steps with a checkpoint every 40; at half of both the seed draws the same kills in the same
places relative to the checkpoints (steps 23, 88 and 99 for 47, 177 and 199: after the first
checkpoint, resumed from it, and just before a checkpoint), in half the training."""

from __future__ import annotations

import random
import signal

import pytest

from facetrain.checkpoint import find_resume_point
from tests.support.fault_helpers import assert_same_checkpoint, kill_all, signal_group, start, wait_for_step
from tests.support.train_helpers import run_cli, tiny_config

STEPS, EVERY, KILLS, SEED = 120, 20, 3, 14


@pytest.mark.slow
def test_a_run_killed_three_times_ends_exactly_where_an_uninterrupted_one_does(tmp_path):
    train, checkpoint = {"steps": STEPS, "log_every": 1}, {"every": EVERY}
    straight = tiny_config(tmp_path, "straight", train=train, checkpoint=checkpoint)
    interrupted = tiny_config(tmp_path, "interrupted", train=train, checkpoint=checkpoint)
    result = run_cli("train", "-c", str(straight), "--nproc", "2", timeout=900)
    assert result.returncode == 0, result.stderr

    kill_steps = sorted(random.Random(SEED).sample(range(EVERY // 2, STEPS), KILLS))
    resumed_from = []
    for attempt, kill_step in enumerate(kill_steps):
        launcher = start(
            "train", "-c", str(interrupted), "--nproc", "2", *(["--resume", "auto"] if attempt else [])
        )
        try:
            wait_for_step(launcher, tmp_path / "interrupted", kill_step, timeout=600)
            signal_group(launcher, signal.SIGKILL)
        finally:
            kill_all(launcher)
        checkpoint, _ = find_resume_point(tmp_path / "interrupted")
        resumed_from.append(checkpoint.name if checkpoint else None)
    result = run_cli("train", "-c", str(interrupted), "--nproc", "2", "--resume", "auto", timeout=900)
    assert result.returncode == 0, result.stderr

    assert all(name is not None for name in resumed_from[1:]), resumed_from
    assert_same_checkpoint(tmp_path / "interrupted", tmp_path / "straight")
