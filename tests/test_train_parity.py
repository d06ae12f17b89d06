"""Sharded-head training over 2 ranks tracks dense single-process training on the same data."""

from __future__ import annotations

import pytest
import torch

from facetrain.config import OptimConfig
from facetrain.heads import DenseMarginHead, ShardedMarginHead
from facetrain.parallel.data_parallel import wrap_data_parallel
from facetrain.train.optim import build_optimizer, learning_rate, set_learning_rate
from tests.distributed import run_distributed

SAMPLES, FEATURES, DIM, CLASSES, GLOBAL_BATCH, STEPS = 96, 48, 16, 10, 8, 20
OPTIM = OptimConfig(lr=0.2, warmup_steps=3, schedule="polynomial", weight_decay=5e-4)


def dataset():
    generator = torch.Generator().manual_seed(0)
    labels = torch.arange(SAMPLES) % CLASSES
    centers = torch.randn(CLASSES, FEATURES, generator=generator)
    return centers[labels] + 0.8 * torch.randn(SAMPLES, FEATURES, generator=generator), labels


def run(rank: int, world_size: int, head_kind: str) -> list[float]:
    from facetrain.data.samplers import ResumableDistributedSampler

    features, labels = dataset()
    torch.manual_seed(0)
    backbone = torch.nn.Sequential(torch.nn.Linear(FEATURES, 32), torch.nn.PReLU(), torch.nn.Linear(32, DIM))
    if head_kind == "sharded":
        head = ShardedMarginHead(CLASSES, DIM, margin="arcface", scale=16.0)
    else:
        head = DenseMarginHead(CLASSES, DIM, margin="arcface", scale=16.0)
        head.num_classes = CLASSES
    full = torch.randn(CLASSES, DIM, generator=torch.Generator().manual_seed(1)) * 0.01
    start = getattr(head, "class_start", 0)
    head.weight.data.copy_(full[start : start + head.weight.shape[0]])
    model = wrap_data_parallel(backbone, torch.device("cpu"))
    optimizer = build_optimizer(OPTIM, backbone, head)
    sampler = ResumableDistributedSampler(SAMPLES, rank, world_size, seed=3)
    local_batch = GLOBAL_BATCH // world_size
    losses, epoch = [], 0
    while len(losses) < STEPS:
        sampler.set_epoch(epoch)
        order = list(sampler)
        for first in range(0, len(order) - local_batch + 1, local_batch):
            if len(losses) == STEPS:
                break
            index = torch.tensor(order[first : first + local_batch])
            set_learning_rate(optimizer, learning_rate(OPTIM, len(losses), STEPS))
            loss = head(model(features[index]), labels[index])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
        epoch += 1
    return losses


def test_two_rank_sharded_training_tracks_dense_single_process():
    sharded = run_distributed(run, 2, "sharded")
    dense = run(0, 1, "dense")
    assert sharded[0] == sharded[1]
    assert sharded[0] == pytest.approx(dense, abs=1e-4)
    assert dense[-1] < dense[0]  # it trains
