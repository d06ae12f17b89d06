"""Optimizer and learning-rate schedule.

The schedule is a pure function of the optimizer step, so a resumed run needs no scheduler state and
gets exactly the learning rate it would have had.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from facetrain.config import OptimConfig
from facetrain.registry import Registry

OPTIMIZERS: Registry[torch.optim.Optimizer] = Registry("optimizer")


@OPTIMIZERS.register("sgd")
def _sgd(groups, cfg: OptimConfig) -> torch.optim.Optimizer:
    return torch.optim.SGD(groups, lr=cfg.lr, momentum=cfg.momentum)


@OPTIMIZERS.register("adamw")
def _adamw(groups, cfg: OptimConfig) -> torch.optim.Optimizer:
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=tuple(cfg.betas))


def build_optimizer(cfg: OptimConfig, backbone: nn.Module, head: nn.Module | None) -> torch.optim.Optimizer:
    """One optimizer over both; the head may have its own weight decay (a pipeline stage may have none)."""
    head_decay = cfg.weight_decay if cfg.head_weight_decay is None else cfg.head_weight_decay
    groups = [{"params": list(backbone.parameters()), "weight_decay": cfg.weight_decay, "name": "backbone"}]
    if head is not None:
        groups.append({"params": list(head.parameters()), "weight_decay": head_decay, "name": "head"})
    return OPTIMIZERS.build(cfg.name, groups, cfg)


SCHEDULES = Registry("lr schedule")


@SCHEDULES.register("polynomial")
def _polynomial(progress: float, cfg: OptimConfig) -> float:
    return (1.0 - progress) ** cfg.power


@SCHEDULES.register("cosine")
def _cosine(progress: float, cfg: OptimConfig) -> float:
    return 0.5 * (1.0 + math.cos(math.pi * progress))


@SCHEDULES.register("constant")
def _constant(progress: float, cfg: OptimConfig) -> float:
    return 1.0


def learning_rate(cfg: OptimConfig, step: int, total_steps: int) -> float:
    """Linear warmup to cfg.lr, then decay to cfg.min_lr by the named schedule."""
    decay = SCHEDULES.get(cfg.schedule)
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    span = max(1, total_steps - cfg.warmup_steps)
    progress = min(1.0, (step - cfg.warmup_steps) / span)
    return cfg.min_lr + (cfg.lr - cfg.min_lr) * decay(progress, cfg)


def set_learning_rate(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr
