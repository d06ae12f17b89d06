"""Applying parallelism to a backbone from outside it (torchtitan's pattern): the model never knows.

Without a pipeline the backbone is replicated with DDP over the data-parallel group. With one, it is
cut into stages, this rank keeps its stage, and the stage is replicated with DDP over the stage's
data-parallel group; the returned `PipelineRuntime` then runs the training step's forward and backward.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from torch import nn

from facetrain.parallel.config import ParallelConfig
from facetrain.parallel.data_parallel import wrap_data_parallel
from facetrain.parallel.dims import ParallelDims
from facetrain.parallel.pipeline import PipelineRuntime


class ParallelBackbone(NamedTuple):
    """`local`: the modules this rank owns, unwrapped (what the optimizer and checkpoints see);
    `model`: what the training step calls (DDP or plain), None with a pipeline; `pipeline`: the runtime."""

    local: nn.Module
    model: nn.Module | None
    pipeline: PipelineRuntime | None


def parallelize_backbone(
    backbone: nn.Module,
    dims: ParallelDims,
    cfg: ParallelConfig,
    batch_shape: Sequence[int],
    broadcast_buffers: bool = True,
) -> ParallelBackbone:
    """Spread `backbone` over the ranks as `dims` lays them out; `batch_shape` is one rank's batch.
    `broadcast_buffers` is DDP's (see `wrap_data_parallel`)."""
    if dims.pp_enabled:
        pipeline = PipelineRuntime(backbone, cfg, dims, batch_shape, broadcast_buffers)
        return ParallelBackbone(pipeline.stage, None, pipeline)
    backbone = backbone.to(dims.device)
    model = wrap_data_parallel(backbone, dims.device, dims.dp_group, broadcast_buffers)
    return ParallelBackbone(backbone, model, None)
