"""Checkpoints: atomic, complete, weights-only, and resharded onto another number of ranks."""

from __future__ import annotations

import pickle
import sys

import pytest
import torch

from facetrain.checkpoint import CheckpointStates, load_backbone_weights, load_full_head, resolve_checkpoint
from facetrain.checkpoint.config import CheckpointConfig
from facetrain.checkpoint.reader import load_checkpoint
from facetrain.checkpoint.writer import save_checkpoint
from facetrain.errors import FacetrainError
from facetrain.heads import ShardedMarginHead
from facetrain.parallel.dims import init_parallel
from facetrain.train.optim import build_optimizer
from facetrain.train.run_config import Config
from facetrain.train.state import TrainState
from tests.support.distributed import run_distributed

NUM_CLASSES, DIM = 11, 6


def config() -> Config:
    cfg = Config()
    cfg.model.embedding_size = DIM
    return cfg


def build(seed=0):
    torch.manual_seed(seed)
    backbone = torch.nn.Sequential(torch.nn.Linear(4, DIM))
    head = ShardedMarginHead(NUM_CLASSES, DIM, margin="cosface")
    head.reset_parameters(seed=seed)
    optimizer = build_optimizer(Config().optim, backbone, head)
    return backbone, head, optimizer


def take_steps(backbone, head, optimizer, steps=2):
    for _ in range(steps):
        loss, _ = head(backbone(torch.randn(4, 4)), torch.randint(0, NUM_CLASSES, (4,)))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def save_worker(rank, world_size, run_dir):
    backbone, head, optimizer = build()
    take_steps(backbone, head, optimizer)
    state = TrainState(step=7, epoch=1, consumed=40)
    names = [str(i) for i in range(NUM_CLASSES)]
    save_checkpoint(
        run_dir, init_parallel(), CheckpointStates(state, config(), names, backbone, head, optimizer, None)
    )
    momentum = optimizer.state[head.weight]["momentum_buffer"]
    return head.class_start, head.weight.detach(), momentum, backbone[0].weight.detach()


def load_worker(rank, world_size, run_dir):
    backbone, head, optimizer = build(seed=1)
    state = load_checkpoint(run_dir, init_parallel(), backbone, head, optimizer, None)
    momentum = optimizer.state[head.weight]["momentum_buffer"]
    return state, head.class_start, head.weight.detach(), momentum, backbone[0].weight.detach()


@pytest.fixture(scope="module")
def two_rank_checkpoint(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("run")
    saved = run_distributed(save_worker, 2, run_dir)
    full_weight = torch.cat([w for _, w, _, _ in saved])
    full_momentum = torch.cat([m for _, _, m, _ in saved])
    return run_dir, full_weight, full_momentum, saved[0][3]


@pytest.mark.parametrize("world_size", [1, 3])
def test_two_rank_checkpoint_resumes_on_other_world_sizes(two_rank_checkpoint, world_size):
    run_dir, full_weight, full_momentum, backbone_weight = two_rank_checkpoint
    if world_size == 1:
        loaded = [load_worker(0, 1, run_dir)]
    else:
        loaded = run_distributed(load_worker, world_size, run_dir)
    assert torch.equal(torch.cat([w for _, _, w, _, _ in loaded]), full_weight)
    assert torch.equal(torch.cat([m for _, _, _, m, _ in loaded]), full_momentum)
    for state, _, _, _, backbone in loaded:
        assert (state["step"], state["epoch"], state["consumed"]) == (7, 1, 40)
        assert torch.equal(backbone, backbone_weight)


def test_full_head_gathers_all_shards(two_rank_checkpoint):
    run_dir, full_weight, _, _ = two_rank_checkpoint
    assert torch.equal(load_full_head(run_dir), full_weight)


def test_pointers_and_layout(two_rank_checkpoint):
    run_dir, *_ = two_rank_checkpoint
    checkpoint = resolve_checkpoint(run_dir)
    assert checkpoint.name == "step_00000007"
    assert resolve_checkpoint(run_dir / "checkpoints" / "last") == checkpoint
    assert {"meta.json", "config.yaml", "classes.json", ".metadata"} <= {p.name for p in checkpoint.iterdir()}
    assert not list((run_dir / "checkpoints").glob("*.tmp"))


def test_incomplete_checkpoint_is_never_taken_for_a_good_one(tmp_path):
    (tmp_path / "checkpoints" / "step_00000005.tmp").mkdir(parents=True)
    with pytest.raises(FacetrainError, match="no checkpoint"):
        resolve_checkpoint(tmp_path)


def test_keeps_the_last_k(tmp_path):
    backbone, head, optimizer = build()
    for step in range(1, 6):
        states = CheckpointStates(TrainState(step=step), config(), [], backbone, head, optimizer, None)
        save_checkpoint(tmp_path, init_parallel(), states, settings=CheckpointConfig(keep=2))
    kept = sorted(p.name for p in (tmp_path / "checkpoints").glob("step_*"))
    assert kept == ["step_00000004", "step_00000005"]


class _Exploit:
    def __reduce__(self):
        return (open, ("/tmp/facetrain-exploit-ran", "w"))


def test_tampered_index_is_refused_without_running_it(tmp_path):
    backbone, head, optimizer = build()
    states = CheckpointStates(TrainState(step=1), config(), [], backbone, head, optimizer, None)
    checkpoint = save_checkpoint(tmp_path, init_parallel(), states)
    (checkpoint / ".metadata").write_bytes(pickle.dumps(_Exploit()))
    with pytest.raises(FacetrainError, match="not allowed"):
        load_full_head(checkpoint)
    assert not __import__("os").path.exists("/tmp/facetrain-exploit-ran")


def batchnorm_worker(rank, world_size, run_dir):
    backbone, head, optimizer = build()
    backbone.append(torch.nn.BatchNorm1d(DIM))
    backbone[1].running_mean.fill_(float(rank + 1))  # each rank's statistics come from its own batches
    states = CheckpointStates(TrainState(step=1), config(), [], backbone, head, optimizer, None)
    save_checkpoint(run_dir, init_parallel(), states)
    return backbone.state_dict()


def test_backbone_statistics_are_rank_zeros(tmp_path):
    rank_zero = run_distributed(batchnorm_worker, 2, tmp_path)[0]
    backbone, _, _ = build()
    backbone.append(torch.nn.BatchNorm1d(DIM))
    load_backbone_weights(resolve_checkpoint(tmp_path), backbone)
    assert all(torch.equal(backbone.state_dict()[k], v) for k, v in rank_zero.items())


def test_a_torch_without_dcp_row_shards_refuses_a_sharded_head(monkeypatch):
    """torch < 2.14 ignores `rows_of`'s offsets and would keep one rank's classes: refused in one line;
    a whole head (one rank) still checkpoints there."""
    from facetrain.checkpoint.storage import rows_of

    monkeypatch.setitem(sys.modules, "torch.distributed.checkpoint.protocol", None)  # import fails
    assert rows_of(torch.zeros(6, 4), 0, 6).global_shape == (6, 4)
    with pytest.raises(FacetrainError, match=r"needs torch >= 2.14 .* train on one rank"):
        rows_of(torch.zeros(3, 4), 3, 6)
