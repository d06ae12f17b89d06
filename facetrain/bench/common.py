"""Measurement helpers shared by the benchmarks: timing, peak memory, machine description, parsing.

Benchmarks that compare ranks run in the worker pool of `facetrain.parallel.workers`; host peak memory is
`facetrain.process_memory.PeakRss`.
"""

from __future__ import annotations

import datetime
import os
import platform
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch

from facetrain.errors import FacetrainError
from facetrain.process_memory import PeakRss


class CudaApi:
    """The few torch.cuda calls the timers and peak-memory windows make, replaceable in tests."""

    synchronize = staticmethod(torch.cuda.synchronize)
    Event = torch.cuda.Event
    empty_cache = staticmethod(torch.cuda.empty_cache)
    reset_peak_memory_stats = staticmethod(torch.cuda.reset_peak_memory_stats)
    memory_allocated = staticmethod(torch.cuda.memory_allocated)
    max_memory_allocated = staticmethod(torch.cuda.max_memory_allocated)


class HostClock:
    """Wall time on the host: on the CPU a call's work is done when it returns."""

    method = "perf_counter"

    def __init__(self, device: torch.device, cuda: type[CudaApi] = CudaApi):
        self.device = device

    def start(self) -> float:
        return time.perf_counter()

    def stop(self, started: float) -> float:
        return time.perf_counter() - started


class CudaClock:
    """Seconds between two CUDA events around a call, the GPU drained before the first.

    Kernels run asynchronously, so host time after the call would miss the work still queued; the
    synchronize before the start event keeps earlier work (a warm-up, the barrier's copies) out.
    """

    method = "cuda-events"

    def __init__(self, device: torch.device, cuda: type[CudaApi] = CudaApi):
        self.device, self.cuda = device, cuda

    def start(self):
        self.cuda.synchronize(self.device)
        event = self.cuda.Event(enable_timing=True)
        event.record()
        return event

    def stop(self, started) -> float:
        end = self.cuda.Event(enable_timing=True)
        end.record()
        end.synchronize()
        return started.elapsed_time(end) / 1000.0


CLOCKS = {"cpu": HostClock, "cuda": CudaClock}


def clock_for(device: torch.device | str | None, cuda: type[CudaApi] = CudaApi) -> HostClock | CudaClock:
    device = torch.device(device or "cpu")
    return CLOCKS[device.type](device, cuda)


def timed_repeats(
    fn: Callable[[], Any],
    repeats: int,
    warmup: int = 0,
    before_each: Callable[[], Any] | None = None,
    device: torch.device | str | None = None,
    cuda: type[CudaApi] = CudaApi,
) -> list[float]:
    """Seconds taken by each of `repeats` calls of `fn`, after `warmup` untimed calls.

    `before_each` runs untimed before every call: a barrier that lines ranks up, a gradient reset. On a
    CUDA `device` each call is timed until its kernels have finished (`CudaClock`).
    """
    clock = clock_for(device, cuda)
    times = []
    for index in range(warmup + repeats):
        if before_each is not None:
            before_each()
        started = clock.start()
        fn()
        elapsed = clock.stop(started)
        if index >= warmup:
            times.append(elapsed)
    return times


def mean_of_max_over_ranks(per_rank: list[list[float]]) -> float:
    """The mean over repeats of the slowest rank: a synchronized step lasts as long as its last rank."""
    return sum(max(values) for values in zip(*per_rank)) / len(per_rank[0])


class CudaPeak:
    """Peak growth of memory allocated by tensors on a CUDA device over a `with` block, in bytes.

    The caching allocator's high-water mark, reset at the start, is what a model can use; the host's
    RSS does not see GPU memory at all.
    """

    method = "cuda-max-allocated"

    def __init__(self, device: torch.device, cuda: type[CudaApi] = CudaApi):
        self.device, self.cuda = device, cuda
        self.baseline_bytes = 0
        self.peak_bytes = 0

    @property
    def growth_bytes(self) -> int:
        return max(0, self.peak_bytes - self.baseline_bytes)

    def __enter__(self) -> CudaPeak:
        self.cuda.synchronize(self.device)
        self.cuda.empty_cache()
        self.cuda.reset_peak_memory_stats(self.device)
        self.baseline_bytes = self.cuda.memory_allocated(self.device)
        return self

    def __exit__(self, *exc_info) -> None:
        self.cuda.synchronize(self.device)
        self.peak_bytes = self.cuda.max_memory_allocated(self.device)


PEAK_MEMORY = {"cpu": lambda device, cuda: PeakRss(), "cuda": CudaPeak}


def peak_memory(device: torch.device | str | None, cuda: type[CudaApi] = CudaApi) -> PeakRss | CudaPeak:
    """The peak-memory window for where the work runs: host RSS on the CPU, allocated bytes on a GPU."""
    device = torch.device(device or "cpu")
    return PEAK_MEMORY[device.type](device, cuda)


def gpu_info(device_kind: str) -> dict[str, Any] | None:
    """The GPU a CUDA benchmark ran on, for its report; None on the CPU."""
    if device_kind != "cuda":
        return None
    properties = torch.cuda.get_device_properties(torch.cuda.current_device())
    return {
        "name": properties.name,
        "memory_total_bytes": properties.total_memory,
        "count": torch.cuda.device_count(),
        "cuda": torch.version.cuda,
    }


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_info() -> dict[str, Any]:
    """What a reader needs to compare figures across machines, recorded with every benchmark."""
    return {
        "cpu_model": cpu_model(),
        "cores": os.cpu_count(),
        "load_average_1_5_15": list(os.getloadavg()),
        "memory_total_bytes": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def parse_int_list(text: str, option: str, minimum: int = 1) -> list[int]:
    """`--classes 100000,1000000` -> [100000, 1000000], or a one-line error naming the option."""
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise FacetrainError(f"{option} must be comma-separated integers, got {text!r}") from None
    if not values or min(values) < minimum:
        raise FacetrainError(f"{option} needs integers >= {minimum}, got {text!r}")
    return list(dict.fromkeys(values))


def parse_name_list(text: str, option: str, known: Iterable[str]) -> list[str]:
    known = list(known)
    names = list(dict.fromkeys(part.strip() for part in text.split(",") if part.strip()))
    unknown = [name for name in names if name not in known]
    if not names or unknown:
        raise FacetrainError(f"{option}: unknown or missing name in {text!r}; choose from {', '.join(known)}")
    return names
