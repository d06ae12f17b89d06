"""Every collective facetrain uses, in one place, beside the sharded head that needs them most.

They live in the head's package so that the head is a library of its own: `import facetrain.heads` needs
torch and nothing of facetrain's training application. `facetrain.parallel`, the checkpoints and the
trainer import them from here.

Without an initialized process group (or with a group of one) each function is the identity, so
callers never branch on whether they run distributed. Each names itself on a failure (`naming`), so the
one-line report `parallel.failures` makes says which collective failed.

Host-side work that some ranks wait for (`primary_first`, `on_every_rank`) takes its group explicitly:
`ParallelDims.control_group`, a gloo group over the CPU. Waiting there instead of in an NCCL collective
keeps NCCL's watchdog out of a wait that only the host's disk or network decides.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
import torch.distributed as dist

from facetrain.errors import FacetrainError, PeerFailed

ProcessGroup = dist.ProcessGroup if dist.is_available() else object

# torch 2.14 renamed the tensor collectives (`all_gather_into_tensor` -> `all_gather_single`,
# `reduce_scatter_tensor` -> `reduce_scatter_single`) and warns on the old names; older torch has only those.
_all_gather_single = getattr(dist, "all_gather_single", None) or getattr(dist, "all_gather_into_tensor", None)
_reduce_scatter_single = getattr(dist, "reduce_scatter_single", None) or getattr(
    dist, "reduce_scatter_tensor", None
)

_COLLECTIVE_ATTRIBUTE = "facetrain_collective"


@contextmanager
def naming(collective: str):
    """Tag a failure raised inside with the collective that raised it (the innermost name wins)."""
    try:
        yield
    except RuntimeError as error:  # DistError is one
        if not hasattr(error, _COLLECTIVE_ATTRIBUTE):
            setattr(error, _COLLECTIVE_ATTRIBUTE, collective)
        raise


def named_collective(error: BaseException) -> str | None:
    """The name `naming` gave the collective that raised `error`; None outside one."""
    return getattr(error, _COLLECTIVE_ATTRIBUTE, None)


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


def all_reduce_(tensor: torch.Tensor, op: str = "sum", group: ProcessGroup | None = None) -> torch.Tensor:
    """Reduce `tensor` in place over the group (op: sum or max)."""
    if not is_active(group):
        return tensor
    reduce_op = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}[op]
    with naming("all_reduce"):
        dist.all_reduce(tensor, op=reduce_op, group=group)
    return tensor


def broadcast_(tensor: torch.Tensor, src: int = 0, group: ProcessGroup | None = None) -> torch.Tensor:
    if not is_active(group):
        return tensor
    with naming("broadcast"):
        dist.broadcast(
            tensor, src=dist.get_global_rank(group, src) if group is not None else src, group=group
        )
    return tensor


def all_gather_equal(tensor: torch.Tensor, group: ProcessGroup | None = None) -> torch.Tensor:
    """Concatenate same-shaped tensors from every rank along dim 0 (no autograd)."""
    if not is_active(group):
        return tensor
    n = world_size(group)
    out = torch.empty((n * tensor.shape[0], *tensor.shape[1:]), dtype=tensor.dtype, device=tensor.device)
    with naming("all_gather"):
        _all_gather_single(out, tensor.contiguous(), group=group)
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


def _pad_rows(tensor: torch.Tensor, rows: int, pad_value: float = 0) -> torch.Tensor:
    if tensor.shape[0] == rows:
        return tensor.contiguous()
    padded = tensor.new_full((rows, *tensor.shape[1:]), pad_value)
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
        counts, rows = ctx.counts, max(ctx.counts)
        stacked = torch.cat([_pad_rows(p, rows) for p in torch.split(grad.contiguous(), counts)])
        return _reduce_scatter_rows(stacked, rows, ctx.group)[: counts[rank(ctx.group)]], None, None


def all_gather_padded(
    tensor: torch.Tensor,
    capacity: int,
    group: ProcessGroup | None = None,
    pad_value: float = 0,
    gradient_averaged: bool = False,
) -> torch.Tensor:
    """Every rank's rows, each rank's padded with `pad_value` to `capacity` rows: (N x capacity, ...).

    The shape depends only on `capacity`, which every rank knows, so ranks whose row counts change from
    step to step need no exchange of counts: padding rows are told apart by their value (labels padded
    with -1). The backward sums the gradient over ranks and hands each rank the gradient of its own rows
    (a reduce-scatter); with `gradient_averaged` (the caller's wrapper, DDP or FSDP, averages the
    gradients it leads to over the N ranks) that gradient is multiplied by N, so the average is the sum.
    """
    if tensor.shape[0] > capacity:
        raise ValueError(f"{tensor.shape[0]} rows do not fit a capacity of {capacity}")
    if not is_active(group):  # one rank: nothing to gather, and N = 1
        return _pad_rows(tensor, capacity, pad_value)
    return _AllGatherPadded.apply(tensor, capacity, group, pad_value, gradient_averaged)


class _AllGatherPadded(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor: torch.Tensor, capacity: int, group, pad_value: float, gradient_averaged: bool):
        ctx.rows, ctx.capacity, ctx.group = tensor.shape[0], capacity, group
        ctx.gradient_averaged = gradient_averaged
        return all_gather_equal(_pad_rows(tensor, capacity, pad_value), group)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        mine = _reduce_scatter_rows(grad.contiguous(), ctx.capacity, ctx.group)[: ctx.rows]
        if ctx.gradient_averaged:
            mine = mine * world_size(ctx.group)
        return mine, None, None, None, None


def _reduce_scatter_rows(stacked: torch.Tensor, rows: int, group) -> torch.Tensor:
    """The sum over ranks of `stacked` (N x rows, ...), this rank's block of `rows` rows."""
    if dist.get_backend(group) == "nccl":
        mine = stacked.new_empty((rows, *stacked.shape[1:]))
        with naming("reduce_scatter"):
            _reduce_scatter_single(mine, stacked, group=group)
        return mine
    # gloo has no reduce-scatter: all-reduce, then keep this rank's rows
    all_reduce_(stacked, "sum", group)
    me = rank(group)
    return stacked[me * rows : (me + 1) * rows]


def barrier(group: ProcessGroup | None = None) -> None:
    if is_active(group):
        with naming("barrier"):
            dist.barrier(group=group)


def _check_host_group(group: ProcessGroup | None) -> None:
    if is_active(group) and dist.get_backend(group) != "gloo":
        raise ValueError(
            f"host-side waits go through a gloo group (ParallelDims.control_group), not {dist.get_backend(group)}"
        )


def primary_first(fn, *, group: ProcessGroup | None, also_others: bool = True):
    """Run `fn` on rank 0, then (with `also_others`) on the other ranks; elsewhere return None.

    For work that must happen once before the others may start (generating a dataset, say). The others
    wait on `group`, which must be a CPU group (`ParallelDims.control_group`; None is the default group,
    gloo when it is the CPU's). If rank 0 fails with a user error, every other rank raises PeerFailed at
    once instead of waiting forever.
    """
    _check_host_group(group)
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


def primary_decides(fn, *, group: ProcessGroup | None):
    """Run `fn` on rank 0 alone and return its result (any picklable object) on every rank.

    For a decision every rank must share that ranks deciding each for itself could make differently:
    one read from files another process changes between their looks. The others wait on `group`, a CPU
    group as for `primary_first`; a user error on rank 0 is raised there and as PeerFailed elsewhere.
    """
    _check_host_group(group)
    if not is_active(group):
        return fn()
    outcome, failure = [None, False], None  # (rank 0's result, whether it failed)
    if rank(group) == 0:
        try:
            outcome[0] = fn()
        except FacetrainError as error:
            outcome[1], failure = True, error
    with naming("broadcast_object_list"):
        dist.broadcast_object_list(
            outcome, src=dist.get_global_rank(group, 0) if group is not None else 0, group=group
        )
    if failure is not None:
        raise failure
    if outcome[1]:
        raise PeerFailed("rank 0 failed")
    return outcome[0]


def on_every_rank(fn, *, group: ProcessGroup | None):
    """Run `fn` on every rank at once and agree over `group` (a CPU group, as for `primary_first`) on
    whether it worked; return its result.

    For host-side work each rank needs for itself, such as scanning the dataset: nobody waits for anybody
    but the slowest scan. A user error on rank 0 is raised there and as PeerFailed elsewhere, so it is
    printed once; one on other ranks only (the data missing on one node) is raised by each of them.
    """
    _check_host_group(group)
    result, failure = None, None
    try:
        result = fn()
    except FacetrainError as error:
        failure = error
    failed = torch.zeros(world_size(group), dtype=torch.int64, device=collective_device(group))
    failed[rank(group)] = int(failure is not None)
    all_reduce_(failed, "sum", group)
    if failure is not None and (rank(group) == 0 or not failed[0]):
        raise failure
    if failed.any():
        raise PeerFailed(f"rank {int(failed.nonzero()[0])} failed")
    return result
