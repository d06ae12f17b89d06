"""Optimizer and learning-rate schedule.

The schedule is a `LambdaLR` whose factor is a pure function of the optimizer step, so a resumed run
rebuilds it at the step it resumes from and gets exactly the learning rate it would have had. Each
parameter group keeps its own base learning rate (`initial_lr`); the factor scales them all, the
backbone's stages under optim.layer_decay included (`facetrain.train.stage_groups`). The `optim`
section of a run's config is `OptimConfig`, beside the optimizers and schedules it names.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import nn
from torch.optim.lr_scheduler import LambdaLR

from facetrain.config.bounds import FRACTION
from facetrain.config.checks import Items, Registered, Within, above, at_least, setting
from facetrain.config.validate import Problem, show
from facetrain.heads.fused_optim import FUSED_OPTIMIZERS, FusedOptimizer
from facetrain.models.backbone import Stages
from facetrain.registry import Registry
from facetrain.train.stage_groups import backbone_groups, freeze_stages

OPTIMIZERS: Registry[torch.optim.Optimizer] = Registry("optimizer")
LR_SCHEDULES: Registry = Registry("lr schedule")


@dataclass
class OptimConfig:
    """The `optim` section of a run's config, checked against the optimizers and schedules below."""

    name: str = setting("sgd", Registered(OPTIMIZERS))  # sgd | adamw
    lr: float = setting(0.1, above(0))
    momentum: float = setting(0.9, FRACTION)
    weight_decay: float = setting(5e-4, at_least(0))
    head_weight_decay: float | None = setting(None, at_least(0))  # None: same as weight_decay
    betas: list[float] = setting([0.9, 0.999], Items(("beta1", "beta2"), FRACTION))
    # polynomial | cosine | constant
    schedule: str = setting("polynomial", Registered(LR_SCHEDULES))
    power: float = setting(2.0, above(0))
    warmup_steps: int = setting(0, at_least(0))
    min_lr: float = setting(0.0, at_least(0))  # and <= lr
    grad_clip: float | None = setting(5.0, above(0))  # max norm of the backbone's gradient; None disables
    grad_accumulation: int = setting(1, Within(1, 2**16))  # micro-steps a step: 1e20 would never end
    backbone_lr_scale: float = setting(1.0, above(0))  # the backbone's lr is lr x this (fine-tuning: < 1)
    head_only_steps: int = setting(0, at_least(0))  # first steps train the head alone, backbone frozen
    # fine-tuning by depth (the backbone's stages, stem first): the first N stages never train, their
    # batch norms keep their statistics; the embedding layer and the head always train
    freeze_stages: int = setting(0, Within(0, 2**16))
    # stage k of the n below the embedding layer learns at the backbone's lr x layer_decay^(n-k); 1: off
    layer_decay: float = setting(1.0, Within(0, 1, "(]"))


def lr_problems(cfg: OptimConfig) -> Iterator[Problem]:
    """The schedule decays from optim.lr to optim.min_lr, so min_lr must not exceed lr."""
    if cfg.min_lr > cfg.lr:
        yield "optim.min_lr", cfg.min_lr, f"must be <= optim.lr ({show(cfg.lr)})"


def _implementation(groups, grad_scaling: bool) -> dict:
    """torch's fused kernels where every parameter is on a GPU: one pass over each parameter for the
    whole update, where the default (foreach) makes one per term (decay, momentum, step); at 2M classes
    on an H100 the head's SGD update went from 16.8 to 7.6 ms (docs/benchmarks.md, GPU).

    Not under fp16's gradient scaling: when the scaler skips the very first step, torch's fused SGD
    has already created the momentum buffer without writing it, and the next step adds that garbage to
    the weights (tests/test_optim.py shows it on the CPU).
    """
    devices = {param.device.type for group in groups for param in group["params"]}
    return {"fused": True} if devices == {"cuda"} and not grad_scaling else {}


@OPTIMIZERS.register("sgd")
def _sgd(groups, cfg: OptimConfig, **implementation) -> torch.optim.Optimizer:
    return torch.optim.SGD(groups, lr=cfg.lr, momentum=cfg.momentum, **implementation)


@OPTIMIZERS.register("adamw")
def _adamw(groups, cfg: OptimConfig, **implementation) -> torch.optim.Optimizer:
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=tuple(cfg.betas), **implementation)


def build_optimizer(
    cfg: OptimConfig,
    backbone: nn.Module,
    head: nn.Module | None,
    grad_scaling: bool = False,
    stages: Stages | None = None,
) -> torch.optim.Optimizer:
    """One optimizer over both; the head may have its own weight decay (a pipeline stage may have none),
    and the backbone its own learning rate (optim.backbone_lr_scale, for fine-tuning), frozen and
    decayed by stage (optim.freeze_stages, optim.layer_decay). `grad_scaling`: the steps go through an
    enabled GradScaler (fp16). `stages`: the whole backbone's (default: `backbone.stages`), where
    `backbone` is a pipeline stage of it."""
    stages = getattr(backbone, "stages", None) if stages is None else stages
    if cfg.freeze_stages:
        freeze_stages(backbone, stages, cfg.freeze_stages)  # the trainer froze them before DDP already
    lr = cfg.lr * cfg.backbone_lr_scale
    groups = backbone_groups(backbone, stages, lr, cfg.weight_decay, cfg.freeze_stages, cfg.layer_decay)
    if head is not None:
        # A head that updates itself (head.fused_optimizer) keeps a group without parameters: the
        # schedule still sets its learning rate, which train_step hands to the head.
        params = [] if getattr(head, "fused_optimizer", None) is not None else list(head.parameters())
        groups.append({"params": params, "weight_decay": head_weight_decay(cfg), "name": "head"})
    optimizer = OPTIMIZERS.build(cfg.name, groups, cfg, **_implementation(groups, grad_scaling))
    for group in optimizer.param_groups:
        group.setdefault("initial_lr", group["lr"])
    return optimizer


def head_weight_decay(cfg: OptimConfig) -> float:
    return cfg.weight_decay if cfg.head_weight_decay is None else cfg.head_weight_decay


def build_fused_optimizer(cfg: OptimConfig, head: nn.Module, state_dtype: torch.dtype) -> FusedOptimizer:
    """The tiled head's own optimizer over its weight, with optim's settings for the head."""
    settings = {"sgd": {"momentum": cfg.momentum}, "adamw": {"betas": tuple(cfg.betas)}}[cfg.name]
    decay = head_weight_decay(cfg)
    return FUSED_OPTIMIZERS.build(
        cfg.name, [head.weight], lr=cfg.lr, weight_decay=decay, state_dtype=state_dtype, **settings
    )


def head_learning_rate(optimizer: torch.optim.Optimizer) -> float:
    return next(group["lr"] for group in optimizer.param_groups if group.get("name") == "head")


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
