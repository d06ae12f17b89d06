"""One optimizer step of training: what every mode (DDP, pipeline, benchmarks, parity tests) runs.

It reads as nanoGPT's or torchvision's loop does: fetch a batch, forward the backbone under autocast,
the head's loss, backward; after the accumulated micro-steps, unscale, clip, step, zero. The pipeline
mode differs only where it must: its schedule runs forward and backward itself. The figures it returns
stay on the device, so a step never waits for the host; read them at log intervals.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from facetrain.parallel.data_parallel import unwrap
from facetrain.parallel.pipeline import PipelineRuntime
from facetrain.train.optim import head_learning_rate

AUTOCAST_DTYPES = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True)
class StepSettings:
    device: torch.device
    precision: str = "fp32"  # fp32 | bf16 | fp16
    accumulation: int = 1
    grad_clip: float | None = None
    channels_last: bool = False

    def autocast(self):
        dtype = AUTOCAST_DTYPES[self.precision]
        return torch.autocast(self.device.type, dtype=dtype, enabled=dtype is not None)

    @property
    def memory_format(self) -> torch.memory_format:
        return torch.channels_last if self.channels_last else torch.contiguous_format


class StepResult(NamedTuple):
    """The step's loss and top-1 accuracy (means over its micro-steps), 0-dim tensors on the device."""

    loss: torch.Tensor
    accuracy: torch.Tensor


def _sync_unless(model: nn.Module, last_micro_step: bool):
    """DDP all-reduces gradients on the last micro-step only; earlier ones accumulate locally."""
    if isinstance(model, DistributedDataParallel) and not last_micro_step:
        return model.no_sync()
    return contextlib.nullcontext()


def train_step(
    batches: Iterator[tuple[torch.Tensor, torch.Tensor]],
    model: nn.Module | None,
    head: nn.Module | None,
    optimizer: torch.optim.Optimizer,
    scaler: torch.amp.GradScaler,
    settings: StepSettings,
    pipeline: PipelineRuntime | None = None,
    train_backbone: bool = True,
    loss_fn: Callable[..., tuple[torch.Tensor, torch.Tensor]] | None = None,
) -> StepResult:
    """Consume `settings.accumulation` batches and take one optimizer step.

    `model` is the backbone as parallelized for data parallelism (DDP or plain); with a `pipeline` it is
    unused and the pipeline runs this rank's stage. `head` maps (embeddings, labels) to (loss, accuracy);
    it is None on pipeline stages that do not hold it. `loss_fn` maps the model's outputs and labels
    to (loss, accuracy) when that is more than the head (`facetrain.train.losses`, e.g. the head plus
    a triplet loss); None: the head. With `train_backbone=False` (fine-tuning's first steps,
    optim.head_only_steps) the backbone runs without autograd, so only the head learns.
    """
    criterion = head if loss_fn is None else loss_fn
    fused = getattr(head, "fused_optimizer", None)
    if fused is not None:  # the tiled head updates itself inside the backward, at the schedule's rate
        fused.param_groups[0]["lr"] = head_learning_rate(optimizer)
    loss_sum = torch.zeros((), device=settings.device)
    accuracy_sum = torch.zeros((), device=settings.device)
    for micro_step in range(settings.accumulation):
        images, labels = next(batches)
        images = images.to(settings.device, non_blocking=True, memory_format=settings.memory_format)
        labels = labels.to(settings.device, non_blocking=True)
        if pipeline is not None:
            loss, accuracy = pipeline.step(images, labels, criterion)
        else:
            with _sync_unless(model, micro_step == settings.accumulation - 1):
                with settings.autocast():
                    with torch.set_grad_enabled(train_backbone):
                        outputs = model(images)
                    loss, accuracy = criterion(outputs, labels)
                scaler.scale(loss / settings.accumulation).backward()
        loss_sum += loss.detach()
        accuracy_sum += accuracy.detach()

    scaler.unscale_(optimizer)
    if settings.grad_clip is not None:
        if pipeline is not None:
            pipeline.clip_grad_norm_(settings.grad_clip)
        else:
            torch.nn.utils.clip_grad_norm_(unwrap(model).parameters(), settings.grad_clip)
    scaler.step(optimizer)  # an fp16 step with non-finite gradients is skipped here
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    return StepResult(loss_sum / settings.accumulation, accuracy_sum / settings.accumulation)
