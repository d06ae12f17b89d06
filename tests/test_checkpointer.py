"""The `Checkpointer` a run talks to: it claims and locks the run directory, finds what to resume from,
says when a checkpoint is due, and saves the states it was given where `--resume auto` finds them."""

from __future__ import annotations

import json

import pytest
import torch

from facetrain import run_lock
from facetrain.checkpoint import Checkpointer, CheckpointStates, load_checkpoint
from facetrain.checkpoint.run_dir import RUN_MARKER
from facetrain.heads import ShardedMarginHead
from facetrain.parallel.dims import init_parallel
from facetrain.train.optim import build_optimizer
from facetrain.train.run_config import Config
from facetrain.train.state import TrainState

CLASSES, DIM = 5, 4


def states(train_state: TrainState) -> CheckpointStates:
    torch.manual_seed(0)
    backbone = torch.nn.Linear(3, DIM)
    head = ShardedMarginHead(CLASSES, DIM, margin="cosface")
    return CheckpointStates(
        train_state, backbone, head, build_optimizer(Config().optim, backbone, head), None
    )


@pytest.mark.parametrize(
    ("step", "final_step", "is_best", "interval_due", "due"),
    [
        (3, False, False, False, False),
        (4, False, False, False, True),  # every train.checkpoint_every steps
        (3, True, False, False, True),
        (3, False, True, False, True),
        (3, False, False, True, True),  # train.checkpoint_every_minutes, agreed by the ranks
    ],
)
def test_should_save(tmp_path, step, final_step, is_best, interval_due, due):
    checkpointer = Checkpointer(tmp_path, init_parallel(), every_steps=2, keep=3)
    assert checkpointer.should_save(step, final_step, is_best, interval_due) is due


def test_a_claimed_run_saves_its_states_and_resumes_from_them(tmp_path):
    run_dir = tmp_path / "run"
    config = Config()
    config.model.embedding_size = DIM
    checkpointer = Checkpointer(run_dir, init_parallel(), every_steps=2, keep=1)
    checkpointer.claim()
    assert run_lock.holds(run_dir) and (run_dir / RUN_MARKER).is_file()
    assert checkpointer.find_resume(None) == (None, [])
    train_state = TrainState(step=2, epoch=1, consumed=6)
    checkpointer.hold(states(train_state), config, [str(c) for c in range(CLASSES)], resumed_from=None)
    assert checkpointer.last is None and not checkpointer.holds_step(2)
    first = checkpointer.save(is_best=False)
    train_state.step = 4
    second = checkpointer.save(is_best=False)
    checkpointer.close()
    assert not run_lock.holds(run_dir)
    assert checkpointer.last == second and checkpointer.holds_step(4)
    assert not first.exists()  # keep=1: the stale one is pruned
    assert json.loads((second / "meta.json").read_text())["consumed"] == 6

    resumed = Checkpointer(run_dir, init_parallel(), every_steps=2, keep=1)
    with pytest.raises(Exception, match="already holds checkpoints"):
        resumed.find_resume(None)
    checkpoint, notes = resumed.find_resume("auto")
    assert (checkpoint, notes) == (second, [])
    again = TrainState()
    parts = states(again)
    again.load_state_dict(
        load_checkpoint(checkpoint, init_parallel(), parts.backbone, parts.head, parts.optimizer, None)
    )
    assert again == TrainState(step=4, epoch=1, consumed=6)
