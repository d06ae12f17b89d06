"""Pipeline-parallel training of a backbone split into stages over ranks (torch.distributed.pipelining).

The backbone never learns it is split: `PipelineRuntime` cuts it from outside (at configured module
names, or where measured costs balance), keeps this rank's stage, and runs one GPipe or 1F1B schedule
per training step over M micro-batches. Rank r runs stage `r // D` as data-parallel replica `r % D`
(see `pipeline_groups`); after each step the D replicas of a stage average their gradients, as DDP
would. The loss function (for example the sharded margin head, sharded over the last stage's
`dp_group`) runs on the last stage only.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

from facetrain.config.schema import ParallelConfig
from facetrain.errors import FacetrainError
from facetrain.parallel import comm
from facetrain.parallel.env import DistEnv
from facetrain.parallel.pipeline_groups import PipelineGrid, pipeline_grid
from facetrain.parallel.pipeline_split import (
    balanced_boundaries,
    boundaries_from_split_points,
    measure_unit_costs,
    pipeline_units,
    split_backbone,
)
from facetrain.registry import Registry

SCHEDULES: Registry = Registry("pipeline schedule")
SCHEDULES.register("gpipe")(ScheduleGPipe)
SCHEDULES.register("1f1b")(Schedule1F1B)

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def plan_split(
    backbone: nn.Module, cfg: ParallelConfig, env: DistEnv, microbatch_shape: Sequence[int]
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
    starts = torch.zeros(stages - 1, dtype=torch.int64, device=env.device)
    if env.rank == 0:
        sample = torch.randn(tuple(microbatch_shape), device=env.device)
        costs = measure_unit_costs(units, sample)
        starts = torch.tensor(balanced_boundaries(costs, stages), dtype=torch.int64, device=env.device)
    comm.broadcast_(starts, src=0)
    return starts.tolist()


def _broadcast_flat(tensors: list[torch.Tensor], group: comm.ProcessGroup) -> None:
    """Make `tensors` equal to the group's first rank's, in one message per dtype."""
    for dtype in dict.fromkeys(t.dtype for t in tensors):  # first-seen order: the same on every rank
        same = [t for t in tensors if t.dtype == dtype]
        flat = torch.cat([t.detach().reshape(-1) for t in same])
        comm.broadcast_(flat, src=0, group=group)
        offset = 0
        for tensor in same:
            tensor.data.copy_(flat[offset : offset + tensor.numel()].view_as(tensor))
            offset += tensor.numel()


class PipelineRuntime:
    """This rank's stage of a pipelined backbone and the schedule that trains it.

    Every rank of the world calls `step` with the same arguments shape: the first stage consumes
    `images`, the last stage `labels` and `loss_fn`; others ignore them. Every rank of one pipeline
    must be fed the same batch, so shard data by `dp_index` over `replicas`, not by global rank.
    """

    def __init__(
        self,
        backbone: nn.Module,
        cfg: ParallelConfig,
        env: DistEnv,
        sample_input_shape: Sequence[int],
        gradient_reduction: str = "mean",
    ):
        """`gradient_reduction` combines the D replicas' stage gradients: "mean" when each replica's loss
        is the mean over its own batch (as plain DDP assumes), "sum" when the loss is already the mean
        over all replicas' batches, as the sharded head's is (each replica then holds its share)."""
        if gradient_reduction not in ("mean", "sum"):
            raise ValueError(f"gradient_reduction must be mean or sum, got {gradient_reduction!r}")
        self.gradient_reduction = gradient_reduction
        batch = int(sample_input_shape[0])
        if cfg.microbatches < 1 or batch % cfg.microbatches:
            raise FacetrainError(
                f"parallel.microbatches={cfg.microbatches} must divide the per-rank batch of {batch}"
            )
        if cfg.schedule == "1f1b" and cfg.microbatches < cfg.pipeline_stages:
            raise FacetrainError(
                f"parallel.schedule=1f1b needs parallel.microbatches >= pipeline_stages "
                f"({cfg.microbatches} < {cfg.pipeline_stages})"
            )
        schedule_class = SCHEDULES.get(cfg.schedule)
        self.env = env
        self.grid: PipelineGrid = pipeline_grid(env, cfg.pipeline_stages)
        self.microbatches = cfg.microbatches
        self.batch_shape = tuple(int(s) for s in sample_input_shape)
        self.embedding_size = int(getattr(backbone, "embedding_size", 0))
        microbatch_shape = (batch // cfg.microbatches, *self.batch_shape[1:])
        self.stage_starts = plan_split(backbone, cfg, env, microbatch_shape)
        self.module: nn.Sequential = split_backbone(backbone, self.stage_starts)[self.stage_index].to(
            env.device
        )
        _broadcast_flat([*self.module.parameters(), *self.module.buffers()], self.dp_group)
        self._loss_fn: LossFn | None = None
        self._stage = PipelineStage(
            self.module, self.stage_index, self.stages, env.device, group=self.grid.pp_group
        )
        self._schedule = schedule_class(
            self._stage, cfg.microbatches, loss_fn=self._microbatch_loss, scale_grads=False
        )
        self._inference: ScheduleGPipe | None = None

    @property
    def stage_index(self) -> int:
        return self.grid.stage_index

    @property
    def stages(self) -> int:
        return self.grid.stages

    @property
    def dp_index(self) -> int:
        return self.grid.dp_index

    @property
    def replicas(self) -> int:
        return self.grid.replicas

    @property
    def is_first(self) -> bool:
        return self.grid.is_first

    @property
    def is_last(self) -> bool:
        return self.grid.is_last

    @property
    def dp_group(self) -> comm.ProcessGroup:
        """The ranks holding this same stage: average gradients here; shard the head here (last stage)."""
        return self.grid.dp_group

    @property
    def pp_group(self) -> comm.ProcessGroup:
        """The ranks of this rank's pipeline, one per stage, in stage order."""
        return self.grid.pp_group

    def parameters(self):
        return self.module.parameters()

    def named_parameters(self):
        """Named as in the unsplit backbone (`layer3.4.conv1.weight`), so checkpoints need no mapping."""
        return self.module.named_parameters()

    def _microbatch_loss(self, embeddings: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Each micro-batch's mean loss divided by M, so that gradients add up to the batch mean's."""
        return self._loss_fn(embeddings, labels) / self.microbatches

    def _check_batch(self, images: torch.Tensor | None, labels: torch.Tensor | None) -> None:
        if self.is_first and (images is None or tuple(images.shape) != self.batch_shape):
            got = None if images is None else tuple(images.shape)
            raise FacetrainError(f"pipeline stage 0 expects batches of shape {self.batch_shape}, got {got}")
        if self.is_last and (labels is None or labels.shape[0] != self.batch_shape[0]):
            raise FacetrainError(f"the last pipeline stage expects {self.batch_shape[0]} labels per batch")

    def step(
        self,
        images: torch.Tensor | None,
        labels: torch.Tensor | None,
        loss_fn: LossFn,
        average_gradients: bool = True,
    ) -> torch.Tensor:
        """One forward and backward of the whole batch through the pipeline; returns its mean loss.

        Gradients accumulate into `.grad` of the stage (and of whatever `loss_fn` holds). The loss,
        the mean over micro-batches, is returned on every rank of the pipeline. Pass
        `average_gradients=False` on all but the last of several accumulated steps to skip the
        all-reduce, as DDP's `no_sync` does.
        """
        self._check_batch(images, labels)
        self._loss_fn = loss_fn
        device = self.env.device
        arg_mbs = (
            [(chunk,) for chunk in images.to(device).chunk(self.microbatches)] if self.is_first else None
        )
        target_mbs = list(labels.to(device).chunk(self.microbatches)) if self.is_last else None
        losses: list[torch.Tensor] = []
        try:
            self._schedule.step(arg_mbs=arg_mbs, target_mbs=target_mbs, losses=losses, return_outputs=False)
        finally:
            self._loss_fn = None
        loss = torch.stack(losses).sum().detach().float() if self.is_last else torch.zeros((), device=device)
        comm.broadcast_(loss, src=self.stages - 1, group=self.pp_group)
        if average_gradients:
            self.average_gradients()
        return loss

    def average_gradients(self) -> None:
        """Combine this stage's gradients over its D replicas (see `gradient_reduction`), then make the
        batch-norm statistics identical everywhere."""
        if self.replicas == 1:
            return
        grads = [p.grad for p in self.module.parameters() if p.grad is not None]
        if grads:
            flat = torch.cat([g.reshape(-1) for g in grads])
            comm.all_reduce_(flat, "sum", self.dp_group)
            if self.gradient_reduction == "mean":
                flat.div_(self.replicas)
            offset = 0
            for grad in grads:
                grad.copy_(flat[offset : offset + grad.numel()].view_as(grad))
                offset += grad.numel()
        _broadcast_flat(list(self.module.buffers()), self.dp_group)

    def clip_grad_norm_(self, max_norm: float) -> torch.Tensor:
        """Clip by the norm of the whole backbone's gradient, summed over the stages of the pipeline.

        Clipping each stage by its own norm would change the direction of the update compared with the
        unsplit model; the global norm keeps it, as `torch.nn.utils.clip_grad_norm_` does on one rank.
        """
        grads = [p.grad for p in self.module.parameters() if p.grad is not None]
        squares = torch.zeros((), device=self.env.device)
        for grad in grads:
            squares += grad.float().pow(2).sum()
        total = comm.all_reduce_(squares, "sum", self.pp_group).sqrt()
        scale = (max_norm / (total + 1e-6)).clamp(max=1.0)
        for grad in grads:
            grad.mul_(scale.to(grad.dtype))
        return total

    def _inference_schedule(self) -> ScheduleGPipe:
        """A forward-only schedule on the same stage: the training one would ask for a loss."""
        if self._inference is None:
            self._inference = ScheduleGPipe(self._stage, self.microbatches)
        return self._inference

    @torch.no_grad()
    def embed(self, images: torch.Tensor | None, count: int) -> torch.Tensor:
        """Embeddings of `count` images, forward only, returned on every rank of the pipeline.

        The pipeline's buffers have the training batch's shape, so the images go through in batches of
        that size, the last one padded. Call `module.eval()` first for inference statistics.
        """
        batch = self.batch_shape[0]
        device = self.env.device
        outputs = []
        for start in range(0, count, batch):
            out = torch.zeros((batch, self.embedding_size), device=device)
            arg_mbs = None
            if self.is_first:
                chunk = images[start : start + batch].to(device)
                padded = chunk.new_zeros(self.batch_shape)
                padded[: chunk.shape[0]] = chunk
                arg_mbs = [(piece,) for piece in padded.chunk(self.microbatches)]
            result = self._inference_schedule().eval(arg_mbs=arg_mbs)
            if self.is_last:
                out.copy_(result)
            comm.broadcast_(out, src=self.stages - 1, group=self.pp_group)
            outputs.append(out[: min(batch, count - start)])
        return torch.cat(outputs) if outputs else torch.zeros((0, self.embedding_size), device=device)
