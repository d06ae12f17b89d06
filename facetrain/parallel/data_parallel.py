"""DDP for the backbone (or one pipeline stage of it), with gradients averaged over replicas.

The sharded head follows DDP's convention (its default): each rank's embeddings receive N times their
share of the gradient of the global-batch loss, so DDP's plain average is the single-process gradient.
"""

from __future__ import annotations

import inspect

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from facetrain.heads.collectives import naming

# DDP's switch for broadcasting buffers before each forward: torch 2.14 renamed it, and the old name warns
BUFFER_SYNC_OPTION = (
    "forward_sync_buffers"
    if "forward_sync_buffers" in inspect.signature(DistributedDataParallel.__init__).parameters
    else "broadcast_buffers"
)


class _TaggedDataParallel(DistributedDataParallel):
    """DDP whose own collectives outside the backward (the replicas' first sync when built, the buffer
    broadcast and bucket rebuild before a forward) tag a failure as a collective's: gloo raises a plain
    `RuntimeError` there when a peer dies, and `parallel/failures.py` tells collective failures by tag.
    The backward's gradient all-reduce is tagged by the training step."""

    def __init__(self, *args, **kwargs):
        with naming("broadcast"):
            super().__init__(*args, **kwargs)

    def _pre_forward(self, *inputs, **kwargs):
        with naming("broadcast"):
            return super()._pre_forward(*inputs, **kwargs)


def wrap_data_parallel(
    module: nn.Module,
    device: torch.device,
    group=None,
    broadcast_buffers: bool = True,
) -> nn.Module:
    """DDP-wrap `module` over `group` when it has more than one rank; else return it as is.

    DDP also makes the replicas start from rank 0's parameters and buffers. With `broadcast_buffers`
    it broadcasts rank 0's buffers (batch-norm statistics) before each forward too; without (the CUDA
    default, `facetrain.train.device_defaults`), each replica keeps statistics of its own batches,
    saving a collective a step. Either way the forward normalises with the batch's own statistics and
    checkpoints keep replica 0's running ones.

    The gradients are views of DDP's buckets (`gradient_as_bucket_view`, as torch recommends): each is
    laid out as its bucket is, with no copy between them. Otherwise a compiled backbone's backward
    hands a 1x1 convolution's weight gradient in channels_last strides to a bucket laid out as the
    weight (the two agree but for the size-1 dimensions, which autograd ignores and DDP does not), and
    DDP warns on every rank that the copy may impair performance.
    """
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size(group) == 1:
        return module
    device_ids = [device.index] if device.type == "cuda" else None
    options = {} if broadcast_buffers else {BUFFER_SYNC_OPTION: False}
    return _TaggedDataParallel(
        module, device_ids=device_ids, process_group=group, gradient_as_bucket_view=True, **options
    )


def unwrap(module: nn.Module) -> nn.Module:
    """The module DDP wraps (or the module itself): what checkpoints and evaluation see."""
    return module.module if isinstance(module, DistributedDataParallel) else module
