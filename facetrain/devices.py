"""Which device to run on: the user's `--device`, and each rank's own device.

One place for both, so every command treats `--device` alike (`eval`, `export`, `embed`, `compare` and
the benchmarks) and a rank's GPU is chosen by one rule (`init_parallel`, the benchmarks' ranks).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from facetrain.errors import FacetrainError


def resolve_device(name: str | None, cuda_available: Callable[[], bool] = torch.cuda.is_available) -> str:
    """`--device` as given -> the device to use: None or auto is cuda when torch sees a GPU, else cpu;
    cpu, cuda and cuda:N stay as they are; CUDA where torch sees none is a one-line user error."""
    if name is None or name == "auto":
        return "cuda" if cuda_available() else "cpu"
    if name != "cpu" and name != "cuda" and not (name.startswith("cuda:") and name[5:].isdigit()):
        raise FacetrainError(f"--device must be auto, cpu, cuda or cuda:N, got {name!r}")
    if name.startswith("cuda") and not cuda_available():
        raise FacetrainError(
            f"--device {name}: torch sees no CUDA device (torch.cuda.is_available() is False); "
            "use --device cpu or auto"
        )
    return name


def rank_device(kind: str, local_rank: int) -> torch.device:
    """The device of the rank `local_rank` on its node: for kind cuda its own GPU (ranks share GPUs only
    when there are fewer GPUs than ranks), made the current CUDA device, which NCCL's communicator and
    `collective_device` use; the CPU for kind cpu."""
    if kind == "cuda":
        device = torch.device("cuda", local_rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
        return device
    return torch.device("cpu")
