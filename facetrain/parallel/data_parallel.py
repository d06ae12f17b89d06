"""DDP for the backbone (or one pipeline stage of it), with gradients averaged or summed over replicas.

The sharded head follows DDP's convention (`ShardedMarginHead(gradient_reduction="mean")`, its
default): each rank's embeddings receive N times their share of the gradient of the global-batch loss,
so DDP's plain average is the single-process gradient. "sum" (a communication hook that adds the
replicas' gradients) pairs with a head built with gradient_reduction="sum".
"""

from __future__ import annotations

import inspect

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

GRADIENT_REDUCTIONS = ("sum", "mean")
# DDP's switch for broadcasting buffers before each forward: torch 2.14 renamed it, and the old name warns
BUFFER_SYNC_OPTION = (
    "forward_sync_buffers"
    if "forward_sync_buffers" in inspect.signature(DistributedDataParallel.__init__).parameters
    else "broadcast_buffers"
)


def _sum_allreduce_hook(process_group, bucket):
    group = process_group if process_group is not None else dist.group.WORLD
    work = dist.all_reduce(bucket.buffer(), group=group, async_op=True)
    return work.get_future().then(lambda future: future.value()[0])


def wrap_data_parallel(
    module: nn.Module,
    device: torch.device,
    group=None,
    gradient_reduction: str = "mean",
    broadcast_buffers: bool = True,
) -> nn.Module:
    """DDP-wrap `module` over `group` when it has more than one rank; else return it as is.

    DDP also makes the replicas start from rank 0's parameters and buffers. With `broadcast_buffers`
    it broadcasts rank 0's buffers (batch-norm statistics) before each forward too; without (the CUDA
    default, `facetrain.train.device_defaults`), each replica keeps statistics of its own batches,
    saving a collective a step. Either way the forward normalises with the batch's own statistics and
    checkpoints keep replica 0's running ones.
    """
    if gradient_reduction not in GRADIENT_REDUCTIONS:
        raise ValueError(f"gradient_reduction must be sum or mean, got {gradient_reduction!r}")
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size(group) == 1:
        return module
    device_ids = [device.index] if device.type == "cuda" else None
    options = {} if broadcast_buffers else {BUFFER_SYNC_OPTION: False}
    ddp = DistributedDataParallel(module, device_ids=device_ids, process_group=group, **options)
    if gradient_reduction == "sum":
        ddp.register_comm_hook(group, _sum_allreduce_hook)
    return ddp


def unwrap(module: nn.Module) -> nn.Module:
    """The module DDP wraps (or the module itself): what checkpoints and evaluation see."""
    return module.module if isinstance(module, DistributedDataParallel) else module
