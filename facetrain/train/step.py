"""One optimizer step of training: what every mode (DDP, pipeline, benchmarks, parity tests) runs.

It reads as nanoGPT's or torchvision's loop does: fetch a batch, forward the backbone under autocast,
the head's loss, backward; after the accumulated micro-steps, unscale, clip, step, zero. The pipeline
mode differs only where it must: its schedule runs forward and backward itself. The figures it returns
stay on the device, so a step never waits for the host: a `StepWindow` sums them there, and the loop
reads the host once per log interval.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from facetrain.errors import EveryRankError
from facetrain.heads import collectives
from facetrain.parallel.data_parallel import unwrap
from facetrain.parallel.pipeline import PipelineRuntime
from facetrain.train.precision import precision_autocast


@dataclass(frozen=True)
class StepSettings:
    device: torch.device
    precision: str = "fp32"  # fp32 | bf16 | fp16
    accumulation: int = 1
    grad_clip: float | None = None
    channels_last: bool = False

    def autocast(self):
        return precision_autocast(self.device.type, self.precision)

    @property
    def memory_format(self) -> torch.memory_format:
        return torch.channels_last if self.channels_last else torch.contiguous_format


class StepResult(NamedTuple):
    """The step's loss and top-1 accuracy (means over its micro-steps), 0-dim tensors on the device."""

    loss: torch.Tensor
    accuracy: torch.Tensor


@dataclass
class StepParts:
    """What one optimizer step trains and how: `model` is the backbone as parallelized for data
    parallelism (DDP or plain), unused with a `pipeline`, which then runs this rank's stage; `head` maps
    (embeddings, labels) to (loss, accuracy), None on pipeline stages that do not hold it; `loss` does
    the same from the model's outputs when that is more than the head (`facetrain.train.losses`, e.g.
    the head plus a triplet loss), None: the head; `distillation` adds a frozen teacher's term from the
    images, the model's outputs and, when the batch carries them, the samples' dataset indices (which
    its cache needs; `facetrain.train.distillation`, `loss.teacher`), None: none."""

    model: nn.Module | None
    head: nn.Module | None
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler
    settings: StepSettings
    pipeline: PipelineRuntime | None = None
    loss: Callable[..., tuple[torch.Tensor, torch.Tensor]] | None = None
    distillation: Callable[[torch.Tensor, object, torch.Tensor | None], torch.Tensor] | None = None


def train_step(
    batches: Iterator[tuple[torch.Tensor, ...]], parts: StepParts, train_backbone: bool = True
) -> StepResult:
    """Consume `settings.accumulation` batches, (images, labels) or (images, labels, sample indices),
    and take one optimizer step. With `train_backbone=False` (fine-tuning's first steps,
    optim.head_only_steps) the backbone runs without autograd, so only the head learns. Learning rates
    are the schedule's to set (`facetrain.train.schedulers`), a tiled head's fused optimizer's included:
    the step only takes it."""
    settings, optimizer, scaler, pipeline = parts.settings, parts.optimizer, parts.scaler, parts.pipeline
    criterion = parts.head if parts.loss is None else parts.loss
    ddp = isinstance(parts.model, DistributedDataParallel)
    loss_sum = torch.zeros((), device=settings.device)
    accuracy_sum = torch.zeros((), device=settings.device)
    for micro_step in range(settings.accumulation):
        images, labels, *indices = next(batches)
        images = images.to(settings.device, non_blocking=True, memory_format=settings.memory_format)
        labels = labels.to(settings.device, non_blocking=True)
        if pipeline is not None:
            with collectives.naming("pipeline send/recv"):  # the stages' point-to-point transfers
                loss, accuracy = pipeline.step(images, labels, criterion)
        else:
            # DDP all-reduces gradients on the last micro-step only; earlier ones accumulate locally
            accumulating = ddp and micro_step < settings.accumulation - 1
            with parts.model.no_sync() if accumulating else contextlib.nullcontext():
                with settings.autocast():
                    with torch.set_grad_enabled(train_backbone):
                        outputs = parts.model(images)
                    loss, accuracy = criterion(outputs, labels)
                    if parts.distillation is not None:
                        loss = loss + parts.distillation(images, outputs, *indices)
                # DDP all-reduces the gradients inside; gloo fails it as a plain RuntimeError, so it is
                # tagged as a collective's failure for `parallel/failures.py`
                with (
                    collectives.naming("all_reduce") if ddp and not accumulating else contextlib.nullcontext()
                ):
                    scaler.scale(loss / settings.accumulation).backward()
        loss_sum += loss.detach()
        accuracy_sum += accuracy.detach()

    scaler.unscale_(optimizer)
    if settings.grad_clip is not None:
        if pipeline is not None:
            pipeline.clip_grad_norm_(settings.grad_clip)
        else:
            torch.nn.utils.clip_grad_norm_(unwrap(parts.model).parameters(), settings.grad_clip)
    scaler.step(optimizer)  # an fp16 step with non-finite gradients is skipped here
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    return StepResult(loss_sum / settings.accumulation, accuracy_sum / settings.accumulation)


class StepWindow:
    """Step figures since the last log, summed on the device, plus a watch for non-finite losses."""

    def __init__(self, device: torch.device):
        self.steps, self.started = 0, time.perf_counter()
        self.sums = torch.zeros(2, device=device)
        self.nonfinite_in_a_row = torch.zeros((), dtype=torch.int64, device=device)
        self.worst_nonfinite_run = torch.zeros_like(self.nonfinite_in_a_row)
        self.first_nonfinite_step = torch.full_like(self.nonfinite_in_a_row, -1)

    def add(self, result: StepResult, step: int) -> None:
        finite = torch.isfinite(result.loss)
        self.sums += torch.stack([result.loss, result.accuracy])
        self.nonfinite_in_a_row = torch.where(finite, 0, self.nonfinite_in_a_row + 1)
        self.worst_nonfinite_run = torch.maximum(self.worst_nonfinite_run, self.nonfinite_in_a_row)
        unseen = (~finite) & (self.first_nonfinite_step < 0)
        self.first_nonfinite_step = torch.where(unseen, step, self.first_nonfinite_step)
        self.steps += 1

    def check_finite(self, tolerated_in_a_row: int, good_before: Callable[[int], str | None]) -> None:
        """Stop when the loss went non-finite more often in a row than tolerated (fp16's scaler skips
        such steps and recovers; other precisions tolerate none). One host read. The loss of step k is
        the weights of step k - 1 at work, so the last good checkpoint is `good_before(k - 1)`."""
        worst, first = torch.stack([self.worst_nonfinite_run, self.first_nonfinite_step]).tolist()
        if worst > tolerated_in_a_row:
            raise EveryRankError(
                f"the loss became non-finite at step {first}; last good checkpoint: "
                f"{good_before(first - 1) or 'none'}; lower optim.lr or use train.precision=fp32"
            )

    def reset(self) -> None:
        self.sums.zero_()
        self.steps = 0
        self.started = time.perf_counter()


def check_finite_weights(
    modules: list[nn.Module | None], step: int, good_before: Callable[[int], str | None], group=None
) -> None:
    """Before a checkpoint is written, on every rank (each holds its own head rows): weights can blow up
    (optim.lr=1e30 made them 5e31, then infinite) a step before the loss shows it, and a checkpoint of
    them is no good one. One host read."""
    params = [
        p.detach() for module in modules if module is not None for p in module.parameters() if p.numel()
    ]
    finite = (
        torch.stack([param.abs().amax().float() for param in params]).isfinite().all() if params else True
    )
    bad = torch.tensor([int(not bool(finite))], device=collectives.collective_device(group))
    if collectives.all_reduce_(bad, "max", group).item():
        raise EveryRankError(
            f"the weights became NaN or infinite by step {step}, so no checkpoint of them was written; last "
            f"good checkpoint: {good_before(step) or 'none'}; lower optim.lr or use train.precision=fp32"
        )
