"""Which rank runs which pipeline stage, and the two kinds of process group that follow from it.

With S stages and D data-parallel replicas (world size S x D), rank r runs stage `r // D` as replica
`r % D`. Ranks with the same stage form a data-parallel group (they average that stage's gradients
and share the sharded head on the last stage); ranks with the same replica index form a pipeline
group (they pass activations and gradients from stage to stage). For S = 2, D = 2:

    rank 0: stage 0, replica 0      rank 2: stage 1, replica 0
    rank 1: stage 0, replica 1      rank 3: stage 1, replica 1

so the pipelines are {0, 2} and {1, 3} and the data-parallel groups {0, 1} and {2, 3}. Consecutive
ranks share a stage, so with one node per stage the gradient all-reduce stays inside a node.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch.distributed as dist

from facetrain.errors import FacetrainError
from facetrain.parallel.env import DistEnv


@dataclass(frozen=True)
class PipelineGrid:
    """This rank's place in the S x D grid and the groups it belongs to."""

    stages: int
    replicas: int
    stage_index: int
    dp_index: int
    pp_group: dist.ProcessGroup
    dp_group: dist.ProcessGroup

    @property
    def is_first(self) -> bool:
        return self.stage_index == 0

    @property
    def is_last(self) -> bool:
        return self.stage_index == self.stages - 1


def stage_of(rank: int, replicas: int) -> tuple[int, int]:
    """(stage index, data-parallel index) of a global rank."""
    return rank // replicas, rank % replicas


def pipeline_grid(env: DistEnv, stages: int) -> PipelineGrid:
    """Create every pipeline and data-parallel group (all ranks must call this together)."""
    if stages < 2:
        raise FacetrainError(f"parallel.pipeline_stages={stages}: a pipeline needs at least 2 stages")
    if env.world_size % stages:
        raise FacetrainError(
            f"world size {env.world_size} is not a multiple of parallel.pipeline_stages={stages}; "
            f"start stages x replicas processes"
        )
    if not env.distributed:
        raise FacetrainError("pipeline parallelism needs a process group; start it with torchrun or --nproc")
    replicas = env.world_size // stages
    stage_index, dp_index = stage_of(env.rank, replicas)
    pp_groups = [dist.new_group([s * replicas + d for s in range(stages)]) for d in range(replicas)]
    dp_groups = [dist.new_group([s * replicas + d for d in range(replicas)]) for s in range(stages)]
    return PipelineGrid(stages, replicas, stage_index, dp_index, pp_groups[dp_index], dp_groups[stage_index])
