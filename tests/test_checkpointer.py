"""The `Checkpointer` a run talks to: it claims and locks the run directory, finds what to resume from,
says when a checkpoint is due, saves the states it was given where `--resume auto` finds them, and
restores the whole run from them: weights, optimizer, train state and weight average."""

from __future__ import annotations

import json

import pytest
import torch

from facetrain import run_lock
from facetrain.checkpoint import Checkpointer, CheckpointStates
from facetrain.checkpoint.config import CheckpointConfig
from facetrain.checkpoint.run_dir import RUN_MARKER
from facetrain.heads import ShardedMarginHead
from facetrain.parallel.dims import init_parallel
from facetrain.train.ema import WeightEma
from facetrain.train.optim import build_optimizer
from facetrain.train.run_config import Config
from facetrain.train.state import TrainState

CLASSES, DIM = 5, 4


def states(train_state: TrainState, seed: int = 0, ema_decay: float = 0.0) -> CheckpointStates:
    config = Config()
    config.model.embedding_size = DIM
    torch.manual_seed(seed)
    backbone = torch.nn.Linear(3, DIM)
    head = ShardedMarginHead(CLASSES, DIM, margin="cosface")
    optimizer = build_optimizer(config.optim, backbone, head)
    ema = WeightEma(backbone, ema_decay) if ema_decay else None
    names = [str(c) for c in range(CLASSES)]
    return CheckpointStates(train_state, config, names, backbone, head, optimizer, None, ema)


@pytest.mark.parametrize(
    ("step", "final_step", "is_best", "interval_due", "due"),
    [
        (3, False, False, False, False),
        (4, False, False, False, True),  # every checkpoint.every steps
        (3, True, False, False, True),
        (3, False, True, False, True),
        (3, False, False, True, True),  # checkpoint.every_minutes, agreed by the ranks
    ],
)
def test_due(tmp_path, step, final_step, is_best, interval_due, due):
    checkpointer = Checkpointer(tmp_path, init_parallel(), CheckpointConfig(every=2, keep=3))
    assert checkpointer.due(step, final_step, is_best, interval_due) is due


def test_a_claimed_run_saves_its_states_and_resumes_from_them(tmp_path):
    run_dir = tmp_path / "run"
    settings = CheckpointConfig(every=2, keep=1)
    checkpointer = Checkpointer(run_dir, init_parallel(), settings)
    checkpointer.claim()
    assert run_lock.holds(run_dir) and (run_dir / RUN_MARKER).is_file()
    assert checkpointer.find_resume(None) == (None, [])
    train_state = TrainState(step=2, epoch=1, consumed=6)
    checkpointer.hold(states(train_state))
    assert not checkpointer.load()  # nothing to resume from: a new run
    assert checkpointer.last is None and checkpointer.due_on_stop(2)
    first = checkpointer.save(is_best=False)
    train_state.step = 4
    second = checkpointer.save(is_best=False)
    checkpointer.close()
    assert not run_lock.holds(run_dir)
    assert checkpointer.last == second and not checkpointer.due_on_stop(4)
    assert not first.exists()  # keep=1: the stale one is pruned
    assert json.loads((second / "meta.json").read_text())["consumed"] == 6

    resumed = Checkpointer(run_dir, init_parallel(), settings)
    with pytest.raises(Exception, match="already holds checkpoints"):
        resumed.find_resume(None)
    checkpoint, notes = resumed.find_resume("auto")
    assert (checkpoint, notes) == (second, [])
    again = TrainState()
    resumed.hold(states(again, seed=1))
    assert resumed.load()
    resumed.close()
    assert again == TrainState(step=4, epoch=1, consumed=6)
    assert resumed.last == second and not resumed.due_on_stop(4)


@pytest.mark.parametrize("saved_average", [True, False])
def test_load_restores_the_weight_average_or_starts_it_from_the_restored_weights(tmp_path, saved_average):
    """A run with model.ema_decay resumed from a checkpoint with an average carries it on (and its update
    count); from one without (its run had ema_decay 0), the average starts from the restored weights."""
    writer = Checkpointer(tmp_path, init_parallel(), CheckpointConfig())
    writer.claim()
    saved = states(TrainState(step=3), ema_decay=0.9 if saved_average else 0.0)
    if saved.ema is not None:
        with torch.no_grad():
            for param in saved.ema.module.parameters():
                param.add_(1.0)  # an average apart from the trained weights
    writer.hold(saved)
    writer.save(is_best=False)
    writer.close()

    reader = Checkpointer(tmp_path, init_parallel(), CheckpointConfig())
    reader.find_resume("auto")
    resumed = states(TrainState(), seed=1, ema_decay=0.9)
    reader.hold(resumed)
    assert reader.load()
    expected = (saved.ema.module if saved_average else saved.backbone).state_dict()
    for key, value in resumed.ema.module.state_dict().items():
        assert torch.equal(value, expected[key]), key
    assert resumed.ema.updates == (3 if saved_average else 0)
    assert torch.equal(resumed.backbone.weight, saved.backbone.weight)
