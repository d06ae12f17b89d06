"""The learning-rate schedule of every optimizer a step uses (torchtitan's `LRSchedulersContainer` idea).

The trainer's optimizer is scheduled by a `LambdaLR` (`facetrain.train.optim.build_lr_scheduler`). A
tiled head that updates itself inside the backward (`head.fused_optimizer`) has an optimizer of its own,
whose rate follows the trainer's `head` param group: the schedule sets it whenever it moves, so the
step itself never touches an optimizer's settings.
"""

from __future__ import annotations

import torch
from torch import nn

from facetrain.train.optim import OptimConfig, build_lr_scheduler, head_learning_rate


class LrSchedulers:
    """Steps the trainer's schedule and hands the head group's rate on to the head's fused optimizer."""

    def __init__(self, scheduler: torch.optim.lr_scheduler.LRScheduler, fused: torch.optim.Optimizer | None):
        self.scheduler, self.fused = scheduler, fused
        self._follow()

    def step(self) -> None:
        """After every optimizer step."""
        self.scheduler.step()
        self._follow()

    def get_last_lr(self) -> list[float]:
        return self.scheduler.get_last_lr()

    def _follow(self) -> None:
        if self.fused is not None:
            self.fused.param_groups[0]["lr"] = head_learning_rate(self.scheduler.optimizer)


def build_lr_schedulers(
    optimizer: torch.optim.Optimizer,
    head: nn.Module | None,
    cfg: OptimConfig,
    total_steps: int,
    start_step: int,
) -> LrSchedulers:
    """The schedule positioned at `start_step`, driving `head`'s fused optimizer too where it has one."""
    scheduler = build_lr_scheduler(optimizer, cfg, total_steps, start_step=start_step)
    return LrSchedulers(scheduler, getattr(head, "fused_optimizer", None))
