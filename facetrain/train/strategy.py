"""How the backbone is spread over ranks: DDP replicas, or pipeline stages x replicas.

The training loop talks to either through the same few members, so it reads the same for both:
which data shard this rank reads, which group the head is sharded over, one forward/backward, the
clipping, and what this rank writes into a checkpoint.
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn

from facetrain.config import Config
from facetrain.errors import EveryRankError
from facetrain.parallel import comm
from facetrain.parallel.data_parallel import wrap_data_parallel
from facetrain.parallel.env import DistEnv


class DataParallelStrategy:
    """Every rank holds the whole backbone (DDP, gradients summed) and a shard of the head."""

    def __init__(self, backbone: nn.Module, cfg: Config, env: DistEnv):
        self.backbone = backbone
        self.model = wrap_data_parallel(backbone, env.device)
        self.data_rank, self.data_world_size = env.rank, env.world_size
        self.head_group = None  # the whole world
        self.has_head = True
        self.writes_backbone = env.is_primary  # rank 0's batch-norm statistics are the ones verified
        self.verifies = True

    def parameters(self):
        return self.backbone.parameters()

    def forward_backward(
        self, images, labels, head, autocast, scaler, accumulation: int, last_micro_step: bool
    ):
        sync = contextlib.nullcontext()
        if not last_micro_step and self.model is not self.backbone:
            sync = self.model.no_sync()
        with sync:
            with autocast:
                loss = head(self.model(images), labels)
            scaler.scale(loss / accumulation).backward()
        return loss.detach(), head.accuracy

    def clip_grad_norm_(self, max_norm: float) -> None:
        torch.nn.utils.clip_grad_norm_(self.backbone.parameters(), max_norm)


class PipelineStrategy:
    """Rank r runs pipeline stage r // D as replica r % D; the head is sharded over the last stage's D.

    Every rank of one pipeline reads the same batches (sharded by replica, not by rank); the first stage
    consumes the images, the last the labels. Verification during training is not offered: evaluate a
    checkpoint with `facetrain eval`, which loads the whole backbone.
    """

    def __init__(self, backbone: nn.Module, cfg: Config, env: DistEnv):
        from facetrain.parallel.pipeline import PipelineRuntime

        shape = (cfg.train.batch_size, 3, *cfg.data.image_size)
        self.runtime = PipelineRuntime(backbone, cfg.parallel, env, shape, gradient_reduction="sum")
        self.backbone = self.runtime.module  # this rank's stage, named as in the whole backbone
        self.data_rank, self.data_world_size = self.runtime.dp_index, self.runtime.replicas
        self.head_group = self.runtime.dp_group
        self.has_head = self.runtime.is_last
        self.writes_backbone = self.runtime.dp_index == 0
        self.verifies = False

    def parameters(self):
        return self.runtime.parameters()

    def forward_backward(
        self, images, labels, head, autocast, scaler, accumulation: int, last_micro_step: bool
    ):
        loss = self.runtime.step(images, labels, head)
        device = comm.collective_device(self.runtime.pp_group)
        accuracy = (
            head.accuracy.detach().reshape(1).to(device) if self.has_head else torch.zeros(1, device=device)
        )
        comm.broadcast_(accuracy, src=self.runtime.stages - 1, group=self.runtime.pp_group)
        return loss, accuracy[0]

    def clip_grad_norm_(self, max_norm: float) -> None:
        self.runtime.clip_grad_norm_(max_norm)


def check_strategy_settings(cfg: Config, world_size: int) -> None:
    """Cheap checks of the parallel settings, made before any data or model is built."""
    stages = cfg.parallel.pipeline_stages
    if stages < 1 or world_size % stages:
        raise EveryRankError(
            f"parallel.pipeline_stages={stages} must divide the world size {world_size} (world = stages x replicas)"
        )
    if stages == 1:
        return
    if cfg.train.precision != "fp32":
        raise EveryRankError("parallel.pipeline_stages > 1 supports train.precision=fp32 only")
    if cfg.optim.grad_accumulation != 1:
        raise EveryRankError(
            "parallel.pipeline_stages > 1 uses parallel.microbatches; set optim.grad_accumulation=1"
        )
    if cfg.eval.pairs:
        raise EveryRankError(
            "eval.pairs during training needs parallel.pipeline_stages=1; evaluate the checkpoint "
            "afterwards with facetrain eval"
        )


def build_strategy(backbone: nn.Module, cfg: Config, env: DistEnv):
    check_strategy_settings(cfg, env.world_size)
    if cfg.parallel.pipeline_stages > 1:
        return PipelineStrategy(backbone, cfg, env)
    return DataParallelStrategy(backbone, cfg, env)
