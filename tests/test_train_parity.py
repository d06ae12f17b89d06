"""The trainer's own `train_step` equals a plain dense single-process step, in-process and over 2 ranks."""

from __future__ import annotations

import itertools

import pytest
import torch

from facetrain.heads import DenseMarginHead, ShardedMarginHead
from facetrain.parallel.config import ParallelConfig
from facetrain.parallel.dims import init_parallel
from facetrain.parallel.parallelize import parallelize_backbone
from facetrain.train.optim import OptimConfig, build_lr_scheduler, build_optimizer, lr_factor
from facetrain.train.step import StepParts, StepSettings, train_step
from tests.support.distributed import run_distributed

SAMPLES, FEATURES, DIM, CLASSES, GLOBAL_BATCH, STEPS = 96, 48, 16, 10, 8, 12
OPTIM = OptimConfig(lr=0.2, warmup_steps=3, schedule="polynomial", weight_decay=5e-4, grad_clip=1.0)


def dataset():
    generator = torch.Generator().manual_seed(0)
    labels = torch.arange(SAMPLES) % CLASSES
    centers = torch.randn(CLASSES, FEATURES, generator=generator)
    return centers[labels] + 0.8 * torch.randn(SAMPLES, FEATURES, generator=generator), labels


def global_batches():
    """The global batches every run sees, in order: a fixed permutation, cycled."""
    features, labels = dataset()
    order = torch.randperm(SAMPLES, generator=torch.Generator().manual_seed(3))
    for first in itertools.cycle(range(0, SAMPLES - GLOBAL_BATCH + 1, GLOBAL_BATCH)):
        index = order[first : first + GLOBAL_BATCH]
        yield features[index], labels[index]


def make_backbone() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(FEATURES, 32), torch.nn.PReLU(), torch.nn.Linear(32, DIM))


def initial_head_weight() -> torch.Tensor:
    return torch.randn(CLASSES, DIM, generator=torch.Generator().manual_seed(1)) * 0.01


def dense_reference(steps: int, accumulation: int) -> tuple[list[float], dict, torch.Tensor]:
    """nanoGPT's loop, spelled out: dense head, autograd, torch.optim.SGD, clip, LambdaLR."""
    backbone = make_backbone()
    head = DenseMarginHead(CLASSES, DIM, margin="arcface", scale=16.0)
    head.weight.data.copy_(initial_head_weight())
    optimizer = torch.optim.SGD(
        [*backbone.parameters(), *head.parameters()],
        lr=OPTIM.lr,
        momentum=OPTIM.momentum,
        weight_decay=OPTIM.weight_decay,
    )
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_factor(OPTIM, step, steps))
    batches = global_batches()
    losses = []
    for _ in range(steps):
        total = 0.0
        for _ in range(accumulation):
            images, labels = next(batches)
            loss, _ = head(backbone(images), labels)
            (loss / accumulation).backward()
            total += loss.item() / accumulation
        torch.nn.utils.clip_grad_norm_(backbone.parameters(), OPTIM.grad_clip)
        optimizer.step()
        optimizer.zero_grad()
        schedule.step()
        losses.append(total)
    return losses, backbone.state_dict(), head.weight.detach()


def train_step_run(rank: int, world_size: int, steps: int, accumulation: int):
    """The trainer's pieces: parallelize_backbone, the sharded head, build_optimizer, train_step."""
    dims = init_parallel()
    local_batch = GLOBAL_BATCH // world_size
    local, model, pipeline = parallelize_backbone(
        make_backbone(), dims, ParallelConfig(), (local_batch, FEATURES)
    )
    head = ShardedMarginHead(CLASSES, DIM, margin="arcface", scale=16.0, group=dims.dp_group)
    head.weight.data.copy_(initial_head_weight()[head.class_start : head.class_stop])
    optimizer = build_optimizer(OPTIM, local, head)
    schedule = build_lr_scheduler(optimizer, OPTIM, steps)
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    settings = StepSettings(torch.device("cpu"), accumulation=accumulation, grad_clip=OPTIM.grad_clip)
    parts = StepParts(model, head, optimizer, scaler, settings, pipeline)
    rows = slice(rank * local_batch, (rank + 1) * local_batch)
    batches = ((images[rows], labels[rows]) for images, labels in global_batches())
    losses = []
    for _ in range(steps):
        result = train_step(batches, parts)
        schedule.step()
        losses.append(result.loss.item())
    return losses, local.state_dict(), head.weight.detach()


@pytest.mark.parametrize("accumulation", [1, 2])
def test_train_step_in_process_equals_the_dense_reference(accumulation):
    losses, backbone, head = train_step_run(0, 1, STEPS, accumulation)
    expected_losses, expected_backbone, expected_head = dense_reference(STEPS, accumulation)
    assert losses == pytest.approx(expected_losses, abs=1e-5)
    for name, tensor in expected_backbone.items():
        torch.testing.assert_close(backbone[name], tensor, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(head, expected_head, atol=1e-5, rtol=1e-4)
    assert expected_losses[-1] < expected_losses[0]  # it trains


def test_two_rank_train_step_equals_the_dense_single_process_reference():
    per_rank = run_distributed(train_step_run, 2, STEPS, 1)
    expected_losses, expected_backbone, expected_head = dense_reference(STEPS, 1)
    assert per_rank[0][0] == per_rank[1][0]
    assert per_rank[0][0] == pytest.approx(expected_losses, abs=1e-5)
    for name, tensor in expected_backbone.items():
        torch.testing.assert_close(per_rank[0][1][name], tensor, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(torch.cat([r[2] for r in per_rank]), expected_head, atol=1e-5, rtol=1e-4)
