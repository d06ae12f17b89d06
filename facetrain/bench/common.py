"""Measurement helpers shared by the benchmarks: timing, peak memory, worker processes, outputs.

Benchmarks that compare ranks run in spawned CPU processes joined by gloo, one process per rank, so
that each rank's memory is its own process's memory and the collectives are real ones. The pool is
kept alive across configurations because starting a process that imports torch costs seconds.
"""

from __future__ import annotations

import ctypes
import datetime
import multiprocessing as mp
import os
import platform
import queue
import signal
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch

from facetrain.errors import FacetrainError

PROC_STATUS = Path("/proc/self/status")
PROC_STATM = Path("/proc/self/statm")
PROC_CLEAR_REFS = Path("/proc/self/clear_refs")


def timed_repeats(
    fn: Callable[[], Any], repeats: int, warmup: int = 0, before_each: Callable[[], Any] | None = None
) -> list[float]:
    """Seconds taken by each of `repeats` calls of `fn`, after `warmup` untimed calls.

    `before_each` runs untimed before every call: a barrier that lines ranks up, a gradient reset.
    """
    times = []
    for index in range(warmup + repeats):
        if before_each is not None:
            before_each()
        start = time.perf_counter()
        fn()
        if index >= warmup:
            times.append(time.perf_counter() - start)
    return times


def mean_of_max_over_ranks(per_rank: list[list[float]]) -> float:
    """The mean over repeats of the slowest rank: a synchronized step lasts as long as its last rank."""
    return sum(max(values) for values in zip(*per_rank)) / len(per_rank[0])


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


class WorkerError(RuntimeError):
    """A rank raised, died or timed out; the pool that ran it is closed."""


def _worker_main(rank: int, world_size: int, threads: int, init_method: str, tasks, results) -> None:
    from facetrain.parallel.env import destroy_distributed, init_distributed

    torch.set_num_threads(threads)
    try:
        init_distributed("gloo", timeout_s=1800, rank=rank, world_size=world_size, init_method=init_method)
        while (task := tasks.get()) is not None:
            fn, args = task
            try:
                results.put((rank, True, fn(rank, world_size, *args)))
            except BaseException:
                results.put((rank, False, traceback.format_exc()))
    finally:
        destroy_distributed()


class WorkerPool:
    """`world_size` spawned CPU processes joined by gloo through a file rendezvous in a temp dir.

    `pool.run(fn, *args)` calls `fn(rank, world_size, *args)` on every rank (fn must be a module-level
    function so that it pickles) and returns the results in rank order. When a rank raises, dies or
    exceeds the timeout, the pool is killed at once (the other ranks may be stuck in a collective) and
    `WorkerError` carries the reason; open a new pool to go on.
    """

    def __init__(self, world_size: int, threads_per_rank: int, timeout_s: float = 3600.0):
        self.world_size = world_size
        self.timeout_s = timeout_s
        context = mp.get_context("spawn")
        self._rendezvous_dir = tempfile.TemporaryDirectory(prefix="facetrain-bench-")
        init_method = f"file://{Path(self._rendezvous_dir.name) / 'rendezvous'}"
        self._results = context.Queue()
        self._tasks = [context.Queue() for _ in range(world_size)]
        self._workers = [
            context.Process(
                target=_worker_main,
                args=(rank, world_size, threads_per_rank, init_method, self._tasks[rank], self._results),
                daemon=True,
            )
            for rank in range(world_size)
        ]
        for worker in self._workers:
            worker.start()

    def run(self, fn: Callable[..., Any], *args: Any) -> list[Any]:
        if not self._workers:
            raise WorkerError("the worker pool is closed")
        for task_queue in self._tasks:
            task_queue.put((fn, args))
        outcomes: dict[int, Any] = {}
        deadline = time.monotonic() + self.timeout_s
        while len(outcomes) < self.world_size:
            try:
                rank, ok, payload = self._results.get(timeout=1.0)
            except queue.Empty:
                exit_codes = {r: w.exitcode for r, w in enumerate(self._workers) if not w.is_alive()}
                if exit_codes or time.monotonic() > deadline:
                    self.close()
                    raise WorkerError(self._reason_for_missing_results(exit_codes)) from None
                continue
            if not ok:
                self.close()
                raise WorkerError(f"rank {rank} failed:\n{payload}")
            outcomes[rank] = payload
        return [outcomes[rank] for rank in range(self.world_size)]

    def _reason_for_missing_results(self, exit_codes: dict[int, int | None]) -> str:
        if not exit_codes:
            return f"no result within {self.timeout_s:.0f} s"
        killed = any(code == -signal.SIGKILL for code in exit_codes.values())
        hint = " (SIGKILL: out of memory?)" if killed else ""
        return f"ranks exited before reporting (rank: exit code) {exit_codes}{hint}"

    def close(self) -> None:
        for worker, task_queue in zip(self._workers, self._tasks):
            if worker.is_alive():
                task_queue.put(None)
        for worker in self._workers:
            worker.join(timeout=5)
            if worker.is_alive():
                worker.kill()
                worker.join()
        self._workers = []
        self._rendezvous_dir.cleanup()

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


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
