"""Optimizer and learning-rate schedule.

The schedule is a `LambdaLR` whose factor is a pure function of the optimizer step, so a resumed run
rebuilds it at the step it resumes from and gets exactly the learning rate it would have had. Each
parameter group keeps its own base learning rate (`initial_lr`); the factor scales them all.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.optim.lr_scheduler import LambdaLR

from facetrain.config import OptimConfig
from facetrain.registry import Registry


def _sgd(groups, cfg: OptimConfig) -> torch.optim.Optimizer:
    return torch.optim.SGD(groups, lr=cfg.lr, momentum=cfg.momentum)


def _adamw(groups, cfg: OptimConfig) -> torch.optim.Optimizer:
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=tuple(cfg.betas))


OPTIMIZERS = {"sgd": _sgd, "adamw": _adamw}


def build_optimizer(cfg: OptimConfig, backbone: nn.Module, head: nn.Module | None) -> torch.optim.Optimizer:
    """One optimizer over both; the head may have its own weight decay (a pipeline stage may have none)."""
    head_decay = cfg.weight_decay if cfg.head_weight_decay is None else cfg.head_weight_decay
    groups = [{"params": list(backbone.parameters()), "weight_decay": cfg.weight_decay, "name": "backbone"}]
    if head is not None:
        groups.append({"params": list(head.parameters()), "weight_decay": head_decay, "name": "head"})
    optimizer = OPTIMIZERS[cfg.name](groups, cfg)
    for group in optimizer.param_groups:
        group.setdefault("initial_lr", group["lr"])
    return optimizer


LR_SCHEDULES: Registry = Registry("lr schedule")


@LR_SCHEDULES.register("polynomial")
def _polynomial(progress: float, cfg: OptimConfig) -> float:
    return (1.0 - progress) ** cfg.power


@LR_SCHEDULES.register("cosine")
def _cosine(progress: float, cfg: OptimConfig) -> float:
    return 0.5 * (1.0 + math.cos(math.pi * progress))


@LR_SCHEDULES.register("constant")
def _constant(progress: float, cfg: OptimConfig) -> float:
    return 1.0


def lr_factor(cfg: OptimConfig, step: int, total_steps: int) -> float:
    """The learning rate at `step` over optim.lr: linear warmup to 1, then decay to min_lr / lr."""
    decay = LR_SCHEDULES.get(cfg.schedule)
    if step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    span = max(1, total_steps - cfg.warmup_steps)
    progress = min(1.0, (step - cfg.warmup_steps) / span)
    floor = cfg.min_lr / cfg.lr
    return floor + (1.0 - floor) * decay(progress, cfg)


def build_lr_scheduler(
    optimizer: torch.optim.Optimizer, cfg: OptimConfig, total_steps: int, start_step: int = 0
) -> LambdaLR:
    """The schedule positioned at `start_step`: call `.step()` after every optimizer step."""
    return LambdaLR(optimizer, lambda step: lr_factor(cfg, step, total_steps), last_epoch=start_step - 1)
