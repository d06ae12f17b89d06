"""Bytes each rank sends through collectives, counted by a torch dispatch mode (benchmarks, tests/test_head.py).

Training code calls the collectives plainly. Every `torch.distributed` collective reaches the c10d
operators of torch's dispatcher (what `torch.distributed.tensor.debug.CommDebugMode` counts), so inside
`count_traffic()` a dispatch mode sees each one with its tensors and group and adds up its bytes; outside
it nothing is counted and nothing is wrapped. The mode sees every operator of the block, so benchmarks
count one step and time the others without it. Bytes follow the bandwidth-optimal ring model that NCCL
and gloo implement: all-gather and reduce-scatter send (N-1)/N of the full buffer per rank, all-reduce
twice that; gather, scatter and broadcast send what they move.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode


@dataclass
class Traffic:
    """Bytes this rank sent, in total and per operation."""

    bytes_sent: int = 0
    by_op: Counter = field(default_factory=Counter)

    def add(self, op: str, nbytes: float) -> None:
        self.bytes_sent += int(nbytes)
        self.by_op[op] += int(nbytes)


def _nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def _all_reduce(tensors, group, reduce_op, *_):
    name = "all_reduce_max" if reduce_op.op() == int(dist.ReduceOp.RedOpType.MAX) else "all_reduce_sum"
    n = group.size()
    return name, 2 * (n - 1) / n * sum(map(_nbytes, tensors))


def _all_gather(_output, tensor, group, *_):
    return "all_gather", (group.size() - 1) * _nbytes(tensor)


def _reduce_scatter(_output, tensor, group, *_):
    n = group.size()
    return "reduce_scatter", (n - 1) / n * _nbytes(tensor)


def _broadcast(tensors, group, root, *_):
    return "broadcast", (group.size() - 1) * sum(map(_nbytes, tensors)) if group.rank() == root else 0


def _gather(_outputs, tensors, group, root, *_):
    return "gather", 0 if group.rank() == root else sum(map(_nbytes, tensors))


def _scatter(_outputs, parts, group, root, *_):
    me = group.rank()
    sent = sum(_nbytes(part) for rank, part in enumerate(parts[0]) if rank != me) if parts else 0
    return "scatter", sent if me == root else 0


# c10d operator -> where its group is among its arguments, and (name, bytes this rank sends)
_RING_BYTES = {
    torch.ops.c10d.allreduce_: (1, _all_reduce),
    torch.ops.c10d._allgather_base_: (2, _all_gather),
    torch.ops.c10d._reduce_scatter_base_: (2, _reduce_scatter),
    torch.ops.c10d.broadcast_: (1, _broadcast),
    torch.ops.c10d.gather_: (2, _gather),
    torch.ops.c10d.scatter_: (2, _scatter),
}


class _CountingMode(TorchDispatchMode):
    def __init__(self, traffic: Traffic):
        super().__init__()
        self.traffic = traffic

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        packet = func._overloadpacket
        if packet in _RING_BYTES:
            position, ring_bytes = _RING_BYTES[packet]
            group = dist.ProcessGroup.unbox(args[position])  # the operator takes it boxed
            self.traffic.add(*ring_bytes(*args[:position], group, *args[position + 1 :]))
        return func(*args, **(kwargs or {}))


@contextmanager
def count_traffic() -> Iterator[Traffic]:
    """Count every collective this process issues inside the block."""
    traffic = Traffic()
    with _CountingMode(traffic):
        yield traffic
