"""Where this process sits in the job: one object, built once, passed to everything that needs to know.

The world is a grid of `pp` pipeline stages x `dp` data-parallel replicas (world size = pp x dp). Rank r
runs stage `r // dp` as replica `r % dp`: ranks of one stage form the data-parallel group (they sum that
stage's gradients and shard the margin head), ranks of one replica form the pipeline group (they pass
activations from stage to stage). For pp = 2, dp = 2:

    rank 0: stage 0, replica 0      rank 2: stage 1, replica 0
    rank 1: stage 0, replica 1      rank 3: stage 1, replica 1

Consecutive ranks share a stage, so with one node per stage the gradient all-reduce stays inside a node.
Without a pipeline (pp = 1) the data-parallel group is the whole world. The groups come from a
`torch.distributed.device_mesh.DeviceMesh` of shape (pp, dp).
"""

from __future__ import annotations

import gc
import os
import re
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from facetrain.devices import rank_device
from facetrain.errors import EveryRankError, FacetrainError
from facetrain.parallel.attempt_store import attempt_store
from facetrain.parallel.failures import join_failure_error, keep_check_in_store

ENV_INTEGER = re.compile(r"-?[0-9]{1,30}")
MAX_WORLD_SIZE = 1 << 20  # a million ranks; torch's store takes a 32-bit count


@dataclass(frozen=True)
class ParallelDims:
    """The degrees of parallelism, this rank's coordinates in them, its groups and its device."""

    world_size: int
    rank: int
    local_rank: int
    device: torch.device
    pp: int = 1
    mesh: DeviceMesh | None = None
    # a gloo group over all ranks for small host-side agreements (stop, data failed), so they never
    # synchronize the GPU; None means the default group, which is gloo already on CPU
    control_group: dist.ProcessGroup | None = None

    @property
    def dp(self) -> int:
        return self.world_size // self.pp

    @property
    def pp_enabled(self) -> bool:
        return self.pp > 1

    @property
    def is_primary(self) -> bool:
        return self.rank == 0

    @property
    def stage_index(self) -> int:
        return self.rank // self.dp

    @property
    def dp_rank(self) -> int:
        """This rank's replica index: which shard of the data it reads, and which head shard it holds."""
        return self.rank % self.dp

    @property
    def is_first_stage(self) -> bool:
        return self.stage_index == 0

    @property
    def is_last_stage(self) -> bool:
        """Where the embeddings come out, so where the head lives (every rank without a pipeline)."""
        return self.stage_index == self.pp - 1

    @property
    def writes_backbone(self) -> bool:
        """Replica 0 of every stage writes its part of the backbone: its batch-norm statistics are the
        ones training verified, and together the stages hold the whole backbone once."""
        return self.dp_rank == 0

    @property
    def dp_group(self) -> dist.ProcessGroup | None:
        """Ranks holding the same stage; None (no group) in a single process."""
        return self.mesh.get_group("dp") if self.mesh is not None else None

    @property
    def pp_group(self) -> dist.ProcessGroup | None:
        """Ranks of this rank's pipeline, one per stage in stage order; None without a pipeline."""
        return self.mesh.get_group("pp") if self.pp_enabled else None


def _int_env(name: str, default: int) -> int:
    value = os.environ.get(name)
    if value is None:
        return default
    if not ENV_INTEGER.fullmatch(value.strip()):
        raise FacetrainError(f"environment variable {name}={value[:40]!r} is not an integer")
    return int(value)


def check_group_env(rank: int, world_size: int, local_rank: int, init_method: str | None) -> None:
    """What torchrun sets for a rank to join its group, checked before joining: missing or out of
    range, torch's rendezvous failed with a ValueError, a TypeError from its store, or a rank past the
    world size's C++ frames before its own error."""
    launch = "start the ranks with torchrun or `facetrain train --nproc N`, or unset WORLD_SIZE to train in one process"
    if world_size > MAX_WORLD_SIZE:
        raise FacetrainError(
            f"environment variable WORLD_SIZE={world_size} is more processes than {MAX_WORLD_SIZE}; {launch}"
        )
    for name, value in (("RANK", rank), ("LOCAL_RANK", local_rank)):
        if not 0 <= value < world_size:
            raise FacetrainError(
                f"environment variable {name}={value} is not a rank of WORLD_SIZE={world_size} (0 to "
                f"{world_size - 1}); {launch}"
            )
    if init_method is not None:
        return
    for name in ("MASTER_ADDR", "MASTER_PORT"):
        if not os.environ.get(name, "").strip():
            raise FacetrainError(
                f"environment variable WORLD_SIZE={world_size} asks to join a group of {world_size} processes, "
                f"but {name} is not set; {launch}"
            )
    port = _int_env("MASTER_PORT", 0)
    if not 1 <= port <= 65535:
        raise FacetrainError(f"environment variable MASTER_PORT={port} is not a port (1 to 65535); {launch}")


def check_single_process_env(rank: int, local_rank: int) -> None:
    """A plain process whose environment names another rank (RANK=1 without WORLD_SIZE, left over from
    a launcher's shell) trained as rank 0 of 1 while facetrain's output, which only rank 0 shows, was
    silent: no progress, no log, no error."""
    for name, value in (("RANK", rank), ("LOCAL_RANK", local_rank)):
        if value != 0:
            world = os.environ.get("WORLD_SIZE")
            alone = "without WORLD_SIZE" if world is None else f"with WORLD_SIZE={world}"
            raise FacetrainError(
                f"environment variable {name}={value} is set {alone}, and a single process is rank 0; "
                f"unset {name}, or start the ranks with torchrun or `facetrain train --nproc N`"
            )


def visible_gpus() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def check_backend(backend: str, local_ranks: int, gpus: int, share_gpus: bool = False) -> str:
    """The backend `parallel.backend` means for `local_ranks` ranks on a node with `gpus` visible GPUs,
    refused in one line where NCCL cannot run: before any rank starts (the launcher), at init and for
    the worker pool (`workers.py`), the one chooser of every local start.

    NCCL needs a GPU of its own for every rank; two ranks on one GPU fail in their first collective with
    "Duplicate GPU detected". gloo may share GPUs (and runs on the CPU). A training run's auto refuses
    more ranks than GPUs (the user picks gloo knowingly); with `share_gpus` (the worker pool, whose
    benchmarks report shared-GPU figures as such) auto picks gloo for them instead.
    """
    if backend == "auto":
        backend = "nccl" if gpus > 0 and (local_ranks <= gpus or not share_gpus) else "gloo"
    if backend not in ("gloo", "nccl"):
        raise EveryRankError(f"parallel.backend must be auto, gloo or nccl, got {backend!r}")
    if backend == "nccl" and gpus == 0:
        raise EveryRankError("parallel.backend=nccl needs CUDA devices; use gloo (or auto) on CPU")
    if backend == "nccl" and local_ranks > gpus:
        raise EveryRankError(
            f"{local_ranks} ranks on this node but {gpus} visible GPU(s): nccl needs a GPU per rank; start "
            f"at most {gpus} (--nproc, torchrun --nproc-per-node) or set parallel.backend=gloo to share GPUs"
        )
    return backend


def pick_device(local_rank: int) -> torch.device:
    """One GPU per local rank when there are GPUs (gloo ranks may share one), else the CPU."""
    return rank_device("cuda" if torch.cuda.is_available() else "cpu", local_rank)


def _join_process_group(
    backend: str, timeout_s: float, rank: int, world_size: int, init_method: str | None, device: torch.device
):
    """Through torch's own rendezvous (env:// under torchrun, or `init_method`), whose store is kept for
    the check-in after a failed collective (`failures.py`). `device_id` makes NCCL build its
    communicator now, so its set-up errors are reported as joining."""
    timeout = timedelta(seconds=timeout_s)
    bound = {"device_id": device} if backend == "nccl" else {}
    try:
        store, rank, world_size = next(
            dist.rendezvous(init_method or "env://", rank, world_size, timeout=timeout)
        )
        if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == str(True):
            store = attempt_store(store, rank, world_size, timeout)
        keep_check_in_store(store)
        dist.init_process_group(
            backend=backend, store=store, rank=rank, world_size=world_size, timeout=timeout, **bound
        )
    except dist.DistError as error:
        raise join_failure_error(error, rank, world_size, backend) from error


def init_parallel(
    pipeline_stages: int = 1,
    backend: str = "auto",
    timeout_s: float = 300.0,
    rank: int | None = None,
    world_size: int | None = None,
    init_method: str | None = None,
) -> ParallelDims:
    """Join the process group that torchrun (or `facetrain train --nproc`) describes and lay out the grid.

    With WORLD_SIZE unset or 1 no group is created: every collective in facetrain is then a no-op, so the
    same code runs as a plain single process. A group created earlier (a test harness, a caller that
    runs several trainings in one job) is reused.
    """
    joined = is_initialized()
    from_env = not joined and rank is None and world_size is None
    if joined:
        rank, world_size = dist.get_rank(), dist.get_world_size()
    else:
        rank = _int_env("RANK", 0) if rank is None else rank
        world_size = max(1, _int_env("WORLD_SIZE", 1) if world_size is None else world_size)
    local_rank = _int_env("LOCAL_RANK", rank)
    joining = not joined and world_size > 1
    if from_env and world_size == 1:
        check_single_process_env(rank, local_rank)
    if joining:  # without LOCAL_WORLD_SIZE, at least this rank's GPU must be its own
        check_group_env(rank, world_size, local_rank, init_method)
        backend = check_backend(backend, _int_env("LOCAL_WORLD_SIZE", local_rank + 1), visible_gpus())
    device = pick_device(local_rank)  # before joining: NCCL binds its communicator to it
    if joining:
        _join_process_group(backend, timeout_s, rank, world_size, init_method, device)
    if pipeline_stages < 1 or world_size % pipeline_stages:
        raise EveryRankError(
            f"parallel.pipeline_stages={pipeline_stages} must divide the world size {world_size} "
            "(world = stages x replicas)"
        )
    if world_size == 1:
        return ParallelDims(1, 0, local_rank, device)
    if pipeline_stages == 1:  # a 1-D mesh over the default group: no extra group is created
        mesh = init_device_mesh(device.type, (world_size,), mesh_dim_names=("dp",))
    else:
        shape = (pipeline_stages, world_size // pipeline_stages)
        mesh = init_device_mesh(device.type, shape, mesh_dim_names=("pp", "dp"))
    control_group = None
    if dist.get_backend() != "gloo":
        control_group = dist.new_group(backend="gloo", timeout=timedelta(seconds=timeout_s))
    return ParallelDims(world_size, rank, local_rank, device, pipeline_stages, mesh, control_group)


def is_initialized() -> bool:
    return dist.is_available() and dist.is_initialized()


def destroy_parallel() -> None:
    """Destroy every process group and end the groups' threads now, not at interpreter shutdown.

    `destroy_process_group` leaves a gloo group's threads running while anything still refers to the
    group (a device mesh, a DDP module). They would end while the interpreter shuts down, and one that
    releases a finished collective's tensors then takes the GIL, which aborts the process: SIGABRT
    after a run that went well, now and then, on a loaded machine. Callers drop their references
    first; the collection frees the groups, whose destructors join their threads.
    """
    if is_initialized():
        dist.destroy_process_group()
        gc.collect()
