"""DDP for the backbone, with gradients summed rather than averaged over ranks.

The sharded head's loss is the mean over the *global* batch and is identical on every rank, so the
gradient a rank's backbone receives is already its share of the full gradient: the shares must be
added. DDP's default averaging would shrink the backbone's gradient by the world size.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel


def _sum_allreduce_hook(process_group, bucket):
    group = process_group if process_group is not None else dist.group.WORLD
    work = dist.all_reduce(bucket.buffer(), group=group, async_op=True)
    return work.get_future().then(lambda future: future.value()[0])


def wrap_data_parallel(module: nn.Module, device: torch.device, group=None) -> nn.Module:
    """DDP-wrap `module` when a process group of more than one rank exists; else return it as is."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size(group) == 1:
        return module
    device_ids = [device.index] if device.type == "cuda" else None
    ddp = DistributedDataParallel(module, device_ids=device_ids, process_group=group)
    ddp.register_comm_hook(group, _sum_allreduce_hook)
    return ddp
