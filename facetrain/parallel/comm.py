"""Every collective facetrain uses, in one place, with a count of the bytes each rank sends.

Without an initialized process group (or with a group of one) each function is the identity, so
callers never branch on whether they run distributed. Bytes are counted with the bandwidth-optimal
ring model that NCCL and gloo implement: all-gather and reduce-scatter send (N-1)/N of the full
buffer per rank, all-reduce twice that; gather, scatter and broadcast send what they move.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from facetrain.errors import FacetrainError

ProcessGroup = dist.ProcessGroup if dist.is_available() else object


@dataclass
class Traffic:
    """Bytes this rank sent through collectives since the last reset, in total and per operation."""

    bytes_sent: int = 0
    by_op: Counter = field(default_factory=Counter)

    def add(self, op: str, nbytes: float) -> None:
        self.bytes_sent += int(nbytes)
        self.by_op[op] += int(nbytes)

    def reset(self) -> None:
        self.bytes_sent = 0
        self.by_op.clear()


traffic = Traffic()


def is_active(group: ProcessGroup | None = None) -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size(group) > 1


def world_size(group: ProcessGroup | None = None) -> int:
    return dist.get_world_size(group) if dist.is_available() and dist.is_initialized() else 1


def rank(group: ProcessGroup | None = None) -> int:
    return dist.get_rank(group) if dist.is_available() and dist.is_initialized() else 0


def collective_device(group: ProcessGroup | None = None) -> torch.device:
    """Where a small tensor must live to go through a collective: the GPU for nccl, else the CPU."""
    if is_active(group) and dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def all_reduce_(tensor: torch.Tensor, op: str = "sum", group: ProcessGroup | None = None) -> torch.Tensor:
    """Reduce `tensor` in place over the group (op: sum or max)."""
    if not is_active(group):
        return tensor
    n = world_size(group)
    reduce_op = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}[op]
    dist.all_reduce(tensor, op=reduce_op, group=group)
    traffic.add(f"all_reduce_{op}", 2 * (n - 1) / n * _nbytes(tensor))
    return tensor


def broadcast_(tensor: torch.Tensor, src: int = 0, group: ProcessGroup | None = None) -> torch.Tensor:
    if not is_active(group):
        return tensor
    dist.broadcast(tensor, src=dist.get_global_rank(group, src) if group is not None else src, group=group)
    if rank(group) == src:
        traffic.add("broadcast", (world_size(group) - 1) * _nbytes(tensor))
    return tensor


def gather_row_counts(rows: int, device: torch.device, group: ProcessGroup | None = None) -> list[int]:
    """The number of rows each rank contributes, so that unequal local batches still line up."""
    if not is_active(group):
        return [rows]
    counts = all_gather_equal(torch.tensor([rows], dtype=torch.int64, device=device), group)
    return counts.tolist()


def all_gather_equal(tensor: torch.Tensor, group: ProcessGroup | None = None) -> torch.Tensor:
    """Concatenate same-shaped tensors from every rank along dim 0 (no autograd)."""
    if not is_active(group):
        return tensor
    n = world_size(group)
    out = torch.empty((n * tensor.shape[0], *tensor.shape[1:]), dtype=tensor.dtype, device=tensor.device)
    dist.all_gather_into_tensor(out, tensor.contiguous(), group=group)
    traffic.add("all_gather", (n - 1) * _nbytes(tensor))
    return out


def all_gather_rows(
    tensor: torch.Tensor, counts: list[int], group: ProcessGroup | None = None
) -> torch.Tensor:
    """Concatenate every rank's rows (counts[r] rows from rank r) with a correct backward.

    The backward sums the gradient over ranks and hands each rank the rows it contributed (a
    reduce-scatter), so a rank's embeddings receive the gradient of the whole sharded loss.
    """
    if not is_active(group):
        return tensor
    return _AllGatherRows.apply(tensor, counts, group)


def _pad_rows(tensor: torch.Tensor, rows: int) -> torch.Tensor:
    if tensor.shape[0] == rows:
        return tensor.contiguous()
    padded = tensor.new_zeros((rows, *tensor.shape[1:]))
    padded[: tensor.shape[0]] = tensor
    return padded


def _unpad(stacked: torch.Tensor, counts: list[int], rows: int) -> torch.Tensor:
    if all(c == rows for c in counts):
        return stacked
    return torch.cat([stacked[r * rows : r * rows + c] for r, c in enumerate(counts)])


class _AllGatherRows(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor: torch.Tensor, counts: list[int], group):
        ctx.counts, ctx.group = counts, group
        rows = max(counts)
        return _unpad(all_gather_equal(_pad_rows(tensor, rows), group), counts, rows)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        counts, group = ctx.counts, ctx.group
        rows, me, n = max(counts), rank(group), world_size(group)
        pieces = torch.split(grad.contiguous(), counts)
        stacked = torch.cat([_pad_rows(p, rows) for p in pieces])
        if dist.get_backend(group) == "nccl":
            mine = stacked.new_empty((rows, *stacked.shape[1:]))
            dist.reduce_scatter_tensor(mine, stacked, group=group)
            traffic.add("reduce_scatter", (n - 1) / n * _nbytes(stacked))
        else:  # gloo has no reduce-scatter: all-reduce, then keep this rank's rows
            all_reduce_(stacked, "sum", group)
            mine = stacked[me * rows : (me + 1) * rows]
        return mine[: counts[me]], None, None


def gather_to_root(tensor: torch.Tensor, group: ProcessGroup | None = None) -> torch.Tensor:
    """Concatenate every rank's tensor along dim 1 on rank 0 (the naive model-parallel FC).

    Rank 0 gets the full result; other ranks get an empty tensor that still carries the graph, so
    their backward joins the scatter that returns each rank its slice of the gradient.
    """
    if not is_active(group):
        return tensor
    return _GatherColumnsToRoot.apply(tensor, group)


class _GatherColumnsToRoot(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor: torch.Tensor, group):
        n, me = world_size(group), rank(group)
        widths = [
            int(w) for w in all_gather_equal(torch.tensor([tensor.shape[1]], device=tensor.device), group)
        ]
        ctx.group, ctx.widths = group, widths
        width = max(widths)
        padded = tensor.new_zeros((tensor.shape[0], width))
        padded[:, : tensor.shape[1]] = tensor
        root = dist.get_global_rank(group, 0) if group is not None else 0
        if me == 0:
            parts = [torch.empty_like(padded) for _ in range(n)]
            dist.gather(padded.contiguous(), parts, dst=root, group=group)
            return torch.cat([p[:, :w] for p, w in zip(parts, widths)], dim=1)
        dist.gather(padded.contiguous(), None, dst=root, group=group)
        traffic.add("gather", _nbytes(padded))
        return tensor.new_empty((tensor.shape[0], 0))

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        group, widths = ctx.group, ctx.widths
        me, width = rank(group), max(widths)
        root = dist.get_global_rank(group, 0) if group is not None else 0
        mine = grad.new_empty((grad.shape[0], width))
        if me == 0:
            pieces = torch.split(grad, widths, dim=1)
            parts = [grad.new_zeros((grad.shape[0], width)) for _ in widths]
            for part, piece in zip(parts, pieces):
                part[:, : piece.shape[1]] = piece
            dist.scatter(mine, parts, src=root, group=group)
            traffic.add("scatter", sum(_nbytes(p) for p in parts[1:]))
        else:
            dist.scatter(mine, None, src=root, group=group)
        return mine[:, : widths[me]], None


def barrier(group: ProcessGroup | None = None) -> None:
    if is_active(group):
        dist.barrier(group=group)


def primary_first(fn, also_others: bool = True, group: ProcessGroup | None = None):
    """Run `fn` on rank 0, then (with `also_others`) on the other ranks; elsewhere return None.

    For work that must happen once before the others may start (generating a dataset, say). If rank 0
    fails with a user error, every other rank raises PeerFailed at once instead of waiting forever.
    """
    from facetrain.errors import PeerFailed

    result, failure = None, None
    if rank(group) == 0:
        try:
            result = fn()
        except FacetrainError as error:
            failure = error
    flag = torch.tensor([0 if failure is None else 1], dtype=torch.int64, device=collective_device(group))
    broadcast_(flag, 0, group)
    if failure is not None:
        raise failure
    if int(flag) == 1:
        raise PeerFailed("rank 0 failed")
    if rank(group) == 0:
        return result
    return fn() if also_others else None
