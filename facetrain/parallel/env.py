"""Process-group setup from torchrun's environment, or a single process with no group at all."""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from facetrain.errors import FacetrainError


@dataclass(frozen=True)
class DistEnv:
    """Where this process sits: its rank, the world size, and the device it computes on."""

    rank: int
    world_size: int
    local_rank: int
    device: torch.device

    @property
    def is_primary(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return dist.is_available() and dist.is_initialized()


def _int_env(name: str, default: int) -> int:
    value = os.environ.get(name)
    if value is None:
        return default
    try:
        return int(value)
    except ValueError:
        raise FacetrainError(f"environment variable {name}={value!r} is not an integer") from None


def pick_device(local_rank: int) -> torch.device:
    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
        return device
    return torch.device("cpu")


def init_distributed(
    backend: str = "auto",
    timeout_s: float = 300.0,
    rank: int | None = None,
    world_size: int | None = None,
    init_method: str | None = None,
) -> DistEnv:
    """Join the process group that torchrun (or `facetrain train --nproc`) describes.

    With WORLD_SIZE unset or 1 no group is created: every collective in facetrain is then a no-op,
    so the same code runs as a plain single process.
    """
    if dist.is_available() and dist.is_initialized():  # joined already, e.g. by a test harness
        rank, world_size = dist.get_rank(), dist.get_world_size()
        local_rank = _int_env("LOCAL_RANK", rank)
        return DistEnv(rank, world_size, local_rank, pick_device(local_rank))
    rank = _int_env("RANK", 0) if rank is None else rank
    world_size = _int_env("WORLD_SIZE", 1) if world_size is None else world_size
    local_rank = _int_env("LOCAL_RANK", rank)
    device = pick_device(local_rank)
    if world_size <= 1:
        return DistEnv(rank, max(world_size, 1), local_rank, device)
    if backend == "auto":
        backend = "nccl" if device.type == "cuda" else "gloo"
    if backend not in ("gloo", "nccl"):
        raise FacetrainError(f"parallel.backend must be auto, gloo or nccl, got {backend!r}")
    if backend == "nccl" and device.type != "cuda":
        raise FacetrainError("parallel.backend=nccl needs CUDA devices; use gloo (or auto) on CPU")
    dist.init_process_group(
        backend=backend,
        init_method=init_method or "env://",
        rank=rank,
        world_size=world_size,
        timeout=timedelta(seconds=timeout_s),
    )
    return DistEnv(rank, world_size, local_rank, device)


def is_initialized() -> bool:
    return dist.is_available() and dist.is_initialized()


def destroy_distributed() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
