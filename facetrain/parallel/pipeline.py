"""Pipeline-parallel training of a backbone split into stages over ranks (torch.distributed.pipelining).

The backbone never learns it is split: `PipelineRuntime` cuts it from outside (at configured module
names, or where measured costs balance), keeps this rank's stage, wraps it in DDP over the stage's
data-parallel group (see `ParallelDims`), and runs one GPipe or 1F1B schedule per training step over M
micro-batches. The head (the sharded margin head, sharded over the last stage's data-parallel group)
runs on the last stage only.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn
from torch.distributed.pipelining import PipelineStage

from facetrain.errors import FacetrainError
from facetrain.heads import collectives
from facetrain.parallel.config import ParallelConfig
from facetrain.parallel.data_parallel import wrap_data_parallel
from facetrain.parallel.dims import ParallelDims
from facetrain.parallel.pipeline_schedules import PIPELINE_SCHEDULES
from facetrain.parallel.pipeline_split import (
    balanced_boundaries,
    boundaries_from_split_points,
    measure_unit_costs,
    pipeline_units,
    split_backbone,
    stage_boundary_shapes,
)

# (embeddings, labels) -> (mean loss, top-1 accuracy), as the margin heads return them
HeadFn = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


class _ContiguousBoundary(nn.Module):
    """A stage whose activations cross ranks in the default (NCHW) memory format.

    The pipeline receives into buffers in the default format and point-to-point sends ship raw storage:
    a channels-last stage's output (model.channels_last) would be refused by gloo ("has to be
    contiguous") or read back scrambled over NCCL. Converting costs one copy of the boundary tensor per
    micro-batch; the next channels-last stage converts its input back itself. Input gradients need no
    conversion: GPipe and 1F1B read them from `.grad` of the received buffer, which autograd lays out
    like the buffer.
    """

    def __init__(self, stage: nn.Module):
        super().__init__()
        self.stage = stage

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.stage(x).contiguous()


def plan_split(
    backbone: nn.Module, cfg: ParallelConfig, dims: ParallelDims, microbatch_shape: Sequence[int]
) -> list[int]:
    """Unit indices where stages 1..S-1 begin, the same on every rank.

    Explicit `split_points` are used as given. Otherwise rank 0 alone times the units (timings differ
    between processes, and every rank must cut identically) and broadcasts its cut.
    """
    units = pipeline_units(backbone)
    stages = cfg.pipeline_stages
    if cfg.split_points:
        return boundaries_from_split_points(units, list(cfg.split_points), stages)
    if stages > len(units):
        raise FacetrainError(f"cannot split a backbone of {len(units)} pieces into {stages} pipeline stages")
    starts = torch.zeros(stages - 1, dtype=torch.int64, device=dims.device)
    if dims.is_primary:
        sample = torch.randn(tuple(microbatch_shape), device=dims.device)
        costs = measure_unit_costs(units, sample)
        starts = torch.tensor(balanced_boundaries(costs, stages), dtype=torch.int64, device=dims.device)
    collectives.broadcast_(starts, src=0)
    return starts.tolist()


class PipelineRuntime:
    """This rank's stage of a pipelined backbone and the schedule that trains it.

    Every rank of the world calls `step` with the same arguments: the first stage consumes `images`,
    the last stage `labels` and the head; others ignore them. Every rank of one pipeline must be fed
    the same batch, so shard data by `dims.dp_rank` over `dims.dp`, not by global rank.
    """

    def __init__(
        self,
        backbone: nn.Module,
        cfg: ParallelConfig,
        dims: ParallelDims,
        batch_shape: Sequence[int],
        broadcast_buffers: bool = True,
    ):
        """The stage's replicas average their gradients (`wrap_data_parallel`); `broadcast_buffers` is
        DDP's, as there."""
        if not dims.pp_enabled:
            raise FacetrainError("a pipeline needs parallel.pipeline_stages >= 2 and a process group")
        self.dims = dims
        self.microbatches = cfg.microbatches
        self.batch_shape = tuple(int(s) for s in batch_shape)
        microbatch_shape = (self.batch_shape[0] // cfg.microbatches, *self.batch_shape[1:])
        self.stage_starts = plan_split(backbone, cfg, dims, microbatch_shape)
        shapes = stage_boundary_shapes(backbone, self.stage_starts, microbatch_shape)
        self.stage = split_backbone(backbone, self.stage_starts)[dims.stage_index].to(dims.device)
        self.module = wrap_data_parallel(
            _ContiguousBoundary(self.stage), dims.device, dims.dp_group, broadcast_buffers
        )
        # the stages' tensors, known in advance: nothing is inferred from a first forward at run time
        # (activations from an earlier stage need gradients; the images do not)
        stage_input = torch.empty(shapes[dims.stage_index], device=dims.device)
        stage_input.requires_grad_(not dims.is_first_stage)
        stage_output = torch.empty(shapes[dims.stage_index + 1], device=dims.device, requires_grad=True)
        self._pipeline_stage = PipelineStage(
            self.module,
            dims.stage_index,
            dims.pp,
            dims.device,
            input_args=stage_input,
            output_args=stage_output,
            input_grads=None if dims.is_first_stage else stage_input,
            output_grads=None if dims.is_last_stage else stage_output,
            group=dims.pp_group,
        )
        self._schedule = PIPELINE_SCHEDULES.build(
            cfg.schedule,
            self._pipeline_stage,
            cfg.microbatches,
            loss_fn=self._microbatch_loss,
            scale_grads=False,
        )
        self._head: HeadFn | None = None
        self._accuracies: list[torch.Tensor] = []

    def named_parameters(self):
        """Named as in the unsplit backbone (`layer3.4.conv1.weight`), so checkpoints need no mapping."""
        return self.stage.named_parameters()

    def _microbatch_loss(self, embeddings: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Each micro-batch's mean loss divided by M, so that gradients add up to the batch mean's."""
        loss, accuracy = self._head(embeddings, labels)
        self._accuracies.append(accuracy.detach())
        return loss / self.microbatches

    def _check_batch(self, images: torch.Tensor | None, labels: torch.Tensor | None) -> None:
        if self.dims.is_first_stage and (images is None or tuple(images.shape) != self.batch_shape):
            got = None if images is None else tuple(images.shape)
            raise FacetrainError(f"pipeline stage 0 expects batches of shape {self.batch_shape}, got {got}")
        if self.dims.is_last_stage and (labels is None or labels.shape[0] != self.batch_shape[0]):
            raise FacetrainError(f"the last pipeline stage expects {self.batch_shape[0]} labels per batch")

    def step(
        self, images: torch.Tensor | None, labels: torch.Tensor | None, head: HeadFn | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One forward and backward of the whole batch through the pipeline.

        Gradients accumulate into `.grad` of the stage (averaged over the stage's replicas by
        DDP on the last micro-batch) and of the head. Returns the batch's mean loss and top-1 accuracy
        (means over micro-batches) on every rank of the pipeline, still on the device.
        """
        self._check_batch(images, labels)
        self._head, self._accuracies = head, []
        device = self.dims.device
        arg_mbs = (
            [(chunk,) for chunk in images.to(device).chunk(self.microbatches)]
            if self.dims.is_first_stage
            else None
        )
        target_mbs = list(labels.to(device).chunk(self.microbatches)) if self.dims.is_last_stage else None
        losses: list[torch.Tensor] = []
        try:
            self._schedule.step(arg_mbs=arg_mbs, target_mbs=target_mbs, losses=losses, return_outputs=False)
        finally:
            self._head = None
        figures = torch.zeros(2, device=collectives.collective_device(self.dims.pp_group))
        if self.dims.is_last_stage:
            figures[0] = torch.stack(losses).sum().detach().float()
            figures[1] = torch.stack(self._accuracies).float().mean()
        collectives.broadcast_(figures, src=self.dims.pp - 1, group=self.dims.pp_group)
        figures = figures.to(device)
        return figures[0], figures[1]

    def clip_grad_norm_(self, max_norm: float) -> torch.Tensor:
        """Clip by the norm of the whole backbone's gradient, summed over the stages of the pipeline.

        Clipping each stage by its own norm would change the direction of the update compared with the
        unsplit model; the global norm keeps it, as `torch.nn.utils.clip_grad_norm_` does on one rank.
        """
        grads = [p.grad for p in self.stage.parameters() if p.grad is not None]
        squares = torch.zeros((), device=collectives.collective_device(self.dims.pp_group))
        for grad in grads:
            squares += grad.float().pow(2).sum().to(squares.device)
        total = collectives.all_reduce_(squares, "sum", self.dims.pp_group).sqrt().to(self.dims.device)
        scale = (max_norm / (total + 1e-6)).clamp(max=1.0)
        for grad in grads:
            grad.mul_(scale.to(grad.dtype))
        return total
