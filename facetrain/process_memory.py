"""This process's peak resident memory over a block of code, for the benchmarks and the tests that
check what a head saves (tests/test_head_tiled.py); a GPU's peak is `bench.common.CudaPeak`."""

from __future__ import annotations

import ctypes
import os
import threading
from pathlib import Path

from facetrain.errors import FacetrainError

PROC_STATUS = Path("/proc/self/status")
PROC_STATM = Path("/proc/self/statm")
PROC_CLEAR_REFS = Path("/proc/self/clear_refs")


def _status_kib(field: str) -> int:
    for line in PROC_STATUS.read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise FacetrainError(f"{PROC_STATUS} has no {field} line; peak memory needs Linux /proc")


def current_rss_bytes() -> int:
    return int(PROC_STATM.read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def release_free_heap() -> None:
    """Hand memory that glibc keeps after frees back to the OS, so a new window starts from a true RSS."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _can_reset_high_water_mark() -> bool:
    try:
        PROC_CLEAR_REFS.write_text("5")
    except OSError:
        return False
    return True


class PeakRss:
    """Peak growth of this process's resident memory over a `with` block, in bytes.

    Preferred method `vmhwm-reset`: Linux (>= 4.0) resets the kernel's exact high-water mark VmHWM to
    the current RSS when "5" is written to /proc/self/clear_refs; the peak is VmHWM at the end, so even
    the shortest spike counts. ru_maxrss cannot be reset, so its delta is zero whenever an earlier
    phase peaked higher. Where clear_refs is not writable, `statm-sampling` reads /proc/self/statm from
    a thread every `interval_s` and can miss spikes shorter than that.
    """

    def __init__(self, interval_s: float = 0.001):
        self.interval_s = interval_s
        self.method = ""
        self.baseline_bytes = 0
        self.peak_bytes = 0
        self._stop = threading.Event()
        self._sampler: threading.Thread | None = None

    @property
    def growth_bytes(self) -> int:
        return max(0, self.peak_bytes - self.baseline_bytes)

    def __enter__(self) -> PeakRss:
        release_free_heap()
        if _can_reset_high_water_mark():
            self.method = "vmhwm-reset"
            self.baseline_bytes = _status_kib("VmRSS") * 1024
        else:
            self.method = "statm-sampling"
            self.baseline_bytes = self.peak_bytes = current_rss_bytes()
            self._stop.clear()
            self._sampler = threading.Thread(target=self._sample, daemon=True)
            self._sampler.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.peak_bytes = max(self.peak_bytes, current_rss_bytes())

    def __exit__(self, *exc_info) -> None:
        if self._sampler is None:
            self.peak_bytes = _status_kib("VmHWM") * 1024
            return
        self._stop.set()
        self._sampler.join()
        self.peak_bytes = max(self.peak_bytes, current_rss_bytes())
        self._sampler = None
