"""kill -9 at every point of a checkpoint write: a half-written checkpoint is never taken for a good
one, pruning never removes the last good one first, and `--resume auto` ends exactly where a run that
was never killed ends.

One process (forked from warm imports by tests/support/cli_zygote.py), killed by
`tests/support/fault_injection.py` at the named point of its second checkpoint write (step 4 of 6,
checkpoints every 2 steps, `checkpoint.keep=1` so that every write also prunes).
"""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import pytest

from facetrain.checkpoint import find_resume_point
from facetrain.checkpoint.layout import complete_checkpoints
from tests.support.fault_helpers import assert_same_checkpoint
from tests.support.train_helpers import run_cli, tiny_config

STEPS, EVERY = 6, 2


def config_for(tmp: Path, name: str, keep: int = 1) -> Path:
    return tiny_config(tmp, name, train={"steps": STEPS}, checkpoint={"every": EVERY, "keep": keep})


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("uninterrupted")
    result = run_cli("train", "-c", str(config_for(tmp, "run")))
    assert result.returncode == 0, result.stderr
    return tmp / "run"


def killed_at(point: str, save_number: int, *args: str) -> subprocess.CompletedProcess:
    """A process of its own (forked from warm imports, as run_cli's are) killed at `point`."""
    result = run_cli(point, str(save_number), "train", *args, module="tests.support.fault_injection")
    assert result.returncode == -signal.SIGKILL, result.stderr
    return result


# point -> the checkpoint `--resume auto` must take afterwards
RESUMES_FROM = {
    "tensors": 2,  # step_4.tmp holds tensors only
    "meta": 2,  # step_4.tmp is whole but was never renamed
    "renamed": 2,  # step_4 is whole, but `last` still names step_2: the run continues from there
    "pointer": 4,  # `last` names step_4; step_2 was not yet pruned
    "pruning": 4,  # step_2 is half deleted (renamed .deleting first)
}


@pytest.mark.slow
@pytest.mark.parametrize("point", RESUMES_FROM)
def test_killed_during_a_checkpoint_write_resumes_from_the_last_whole_one(tmp_path, uninterrupted, point):
    config = config_for(tmp_path, "run")
    run = tmp_path / "run"
    killed_at(point, 2, "-c", str(config))
    checkpoint, _ = find_resume_point(run)
    assert checkpoint.name == f"step_{RESUMES_FROM[point]:08d}"
    assert all(p.name.startswith("step_") for p in complete_checkpoints(run))

    result = run_cli("train", "-c", str(config), "--resume", "auto")
    assert result.returncode == 0, result.stderr
    assert f"resumed from {checkpoint} at step {RESUMES_FROM[point]}" in result.stdout
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["last", f"step_{STEPS:08d}"]
    assert_same_checkpoint(run, uninterrupted)


@pytest.mark.slow
def test_killed_while_replacing_a_checkpoint_keeps_the_one_before(tmp_path, uninterrupted):
    """A run resumed from an earlier checkpoint writes its later steps again; killed after moving the
    old step_4 aside and before the new one is renamed in, the run resumes from step_2."""
    config = config_for(tmp_path, "run", keep=3)
    run = tmp_path / "run"
    assert run_cli("train", "-c", str(config), "--set", "train.steps=4").returncode == 0
    step_2 = run / "checkpoints" / "step_00000002"
    killed_at("replacing", 1, "-c", str(config), "--resume", str(step_2))
    checkpoint, notes = find_resume_point(run)
    assert checkpoint == step_2
    assert notes == [f"{run / 'checkpoints' / 'last'} names step_00000004, which is missing or incomplete"]

    result = run_cli("train", "-c", str(config), "--resume", "auto")
    assert result.returncode == 0, result.stderr
    assert not [p for p in (run / "checkpoints").iterdir() if "." in p.name]  # no leftovers
    assert_same_checkpoint(run, uninterrupted)
