"""The schedule drives every optimizer of a step: the tiled head's fused optimizer follows the trainer's
`head` param group at each step, from any step a run resumes at, so `train_step` sets no learning rate."""

from __future__ import annotations

import pytest
import torch

from facetrain.heads import ShardedMarginHead
from facetrain.train.optim import OptimConfig, build_fused_optimizer, build_optimizer, lr_factor
from facetrain.train.schedulers import build_lr_schedulers
from tests.support.head_plans import head_plan

CLASSES, DIM, STEPS = 9, 4, 12
OPTIM = OptimConfig(lr=0.3, warmup_steps=3, min_lr=0.01, schedule="cosine", backbone_lr_scale=0.5)


def fused_run():
    head = ShardedMarginHead(CLASSES, DIM, margin="cosface", plan=head_plan(4, fused=True))
    head.fuse_optimizer(build_fused_optimizer(OPTIM, head, torch.float32))
    optimizer = build_optimizer(OPTIM, torch.nn.Linear(3, DIM), head)
    return head, optimizer


@pytest.mark.filterwarnings(r"ignore:Detected call of `lr_scheduler.step\(\)` before:UserWarning")
@pytest.mark.parametrize("start_step", [0, 5])
def test_the_fused_head_optimizer_follows_the_head_group_at_every_step(start_step):
    head, optimizer = fused_run()
    schedulers = build_lr_schedulers(optimizer, head, OPTIM, STEPS, start_step=start_step)
    groups = {group["name"]: group for group in optimizer.param_groups}
    for step in range(start_step, STEPS):
        expected = OPTIM.lr * lr_factor(OPTIM, step, STEPS)
        assert head.fused_optimizer.param_groups[0]["lr"] == groups["head"]["lr"] == expected
        assert groups["backbone"]["lr"] == OPTIM.lr * OPTIM.backbone_lr_scale * lr_factor(OPTIM, step, STEPS)
        assert schedulers.get_last_lr()[0] == groups["backbone"]["lr"]
        schedulers.step()


def test_a_head_without_a_fused_optimizer_is_scheduled_by_its_group_alone():
    head = ShardedMarginHead(CLASSES, DIM, margin="cosface")
    optimizer = build_optimizer(OPTIM, torch.nn.Linear(3, DIM), head)
    schedulers = build_lr_schedulers(optimizer, head, OPTIM, STEPS, start_step=2)
    assert schedulers.fused is None
    assert optimizer.param_groups[1]["lr"] == OPTIM.lr * lr_factor(OPTIM, 2, STEPS)
