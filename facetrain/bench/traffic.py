"""Bytes each rank sends through collectives, counted during a benchmark by wrapping torch.distributed.

Training code calls the collectives plainly; only inside `count_traffic()` are the functions of
`torch.distributed` replaced by counting wrappers (and restored on exit). Bytes follow the
bandwidth-optimal ring model that NCCL and gloo implement: all-gather and reduce-scatter send (N-1)/N
of the full buffer per rank, all-reduce twice that; gather, scatter and broadcast send what they move.
Collectives that DDP issues from C++ (its default gradient all-reduce) are not seen; facetrain's summing
gradient hook calls `torch.distributed.all_reduce` and is.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from facetrain.parallel import comm


@dataclass
class Traffic:
    """Bytes this rank sent since the last reset, in total and per operation."""

    bytes_sent: int = 0
    by_op: Counter = field(default_factory=Counter)

    def add(self, op: str, nbytes: float) -> None:
        self.bytes_sent += int(nbytes)
        self.by_op[op] += int(nbytes)

    def reset(self) -> None:
        self.bytes_sent = 0
        self.by_op.clear()


def _nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def _sizes(group) -> tuple[int, int]:
    return dist.get_world_size(group), dist.get_rank(group)


def _ring_bytes(op: str, args: tuple, kwargs: dict) -> tuple[str, float]:
    group = kwargs.get("group")
    n, me = _sizes(group)
    if op == "all_reduce":
        reduce_op = kwargs.get("op", dist.ReduceOp.SUM)
        name = "all_reduce_max" if reduce_op == dist.ReduceOp.MAX else "all_reduce_sum"
        return name, 2 * (n - 1) / n * _nbytes(args[0])
    if op == comm.ALL_GATHER:
        return "all_gather", (n - 1) * _nbytes(args[1])
    if op == comm.REDUCE_SCATTER:
        return "reduce_scatter", (n - 1) / n * _nbytes(args[1])
    if op == "broadcast":
        src = kwargs.get("src", args[1] if len(args) > 1 else 0)
        sender = dist.get_rank() == src
        return "broadcast", (n - 1) * _nbytes(args[0]) if sender else 0
    if op == "gather":
        return "gather", 0 if me == 0 else _nbytes(args[0])
    if op == "scatter":
        parts = args[1] if len(args) > 1 else kwargs.get("scatter_list")
        return "scatter", sum(_nbytes(p) for p in parts[1:]) if me == 0 and parts else 0
    raise ValueError(op)


COUNTED = ("all_reduce", comm.ALL_GATHER, comm.REDUCE_SCATTER, "broadcast", "gather", "scatter")


def _counting(op: str, original: Callable, traffic: Traffic) -> Callable:
    def wrapper(*args, **kwargs):
        name, nbytes = _ring_bytes(op, args, kwargs)
        traffic.add(name, nbytes)
        return original(*args, **kwargs)

    return wrapper


@contextmanager
def count_traffic() -> Iterator[Traffic]:
    """Count every facetrain collective issued inside the block (in this process)."""
    traffic = Traffic()
    originals = {op: getattr(dist, op) for op in COUNTED}
    try:
        for op, original in originals.items():
            setattr(dist, op, _counting(op, original, traffic))
        yield traffic
    finally:
        for op, original in originals.items():
            setattr(dist, op, original)
