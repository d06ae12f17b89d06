"""Peak memory of one benchmark window on the device the head runs on.

On the CPU it is the process's RSS growth (`PeakRss`, the kernel's high-water mark); on a GPU the
caching allocator's peak of allocated bytes over the window, which is what a model can use.
"""

from __future__ import annotations

import torch

from facetrain.bench.common import PeakRss


class CudaPeak:
    """Peak growth of memory allocated on the current CUDA device over a `with` block, in bytes."""

    method = "cuda-max-allocated"

    def __init__(self):
        self.baseline_bytes = 0
        self.peak_bytes = 0

    @property
    def growth_bytes(self) -> int:
        return max(0, self.peak_bytes - self.baseline_bytes)

    def __enter__(self) -> CudaPeak:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        self.baseline_bytes = torch.cuda.memory_allocated()
        return self

    def __exit__(self, *exc_info) -> None:
        torch.cuda.synchronize()
        self.peak_bytes = torch.cuda.max_memory_allocated()


def peak_memory(device: torch.device) -> PeakRss | CudaPeak:
    return CudaPeak() if device.type == "cuda" else PeakRss()


def bench_device(kind: str, rank: int) -> torch.device:
    """The device a benchmark rank runs its head on: the CPU, or (kind "cuda") GPU `rank`."""
    if kind == "cuda":
        device = torch.device("cuda", rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
        return device
    return torch.device("cpu")
