"""Where a head benchmark rank runs: the CPU, or one GPU per rank.

Peak memory on either is measured by `facetrain.bench.common.peak_memory`.
"""

from __future__ import annotations

import torch


def bench_device(kind: str, rank: int) -> torch.device:
    """The device a benchmark rank runs its head on: the CPU, or (kind "cuda") GPU `rank`."""
    if kind == "cuda":
        device = torch.device("cuda", rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
        return device
    return torch.device("cpu")
