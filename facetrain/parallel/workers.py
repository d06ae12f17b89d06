"""The one way facetrain runs a function on several local ranks outside training: a pool of spawned
processes (training's ranks start through torch elastic, `launch.py`).

Each rank is a spawned process joined through a file rendezvous in a temporary directory, so each
rank's memory is its own process's memory and the collectives are real ones. Benchmarks and the test
suite (tests/support/distributed.py) both use it. The backend comes from `dims.check_backend`, the
chooser `launch.py` and `init_parallel` use, and each rank's device from `facetrain.devices` through
`init_parallel`.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import signal
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from facetrain.parallel.dims import check_backend, destroy_parallel, init_parallel, visible_gpus


class WorkerError(RuntimeError):
    """A rank raised, died or timed out; the pool that ran it is closed."""


def _worker_main(
    rank: int,
    world_size: int,
    threads: int,
    collective_timeout_s: float,
    init_method: str,
    device: str | None,
    backend: str,
    tasks,
    results,
) -> None:
    if device == "cpu":  # init_parallel places a rank on a GPU whenever it sees one
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
    torch.set_num_threads(threads)
    try:
        init_parallel(
            backend=backend,
            timeout_s=collective_timeout_s,
            rank=rank,
            world_size=world_size,
            init_method=init_method,
        )
        while (task := tasks.get()) is not None:
            fn, args = task
            try:
                results.put((rank, True, fn(rank, world_size, *args)))
            except BaseException:
                results.put((rank, False, traceback.format_exc()))
    finally:
        destroy_parallel()


class WorkerPool:
    """`world_size` spawned processes joined through a file rendezvous in a temp dir, on `device`:
    "cpu" (GPUs hidden from the ranks), "cuda" (rank r on GPU r modulo the GPUs visible; nccl when every
    rank has a GPU of its own, else gloo, which takes CUDA tensors for the collectives the head and DDP
    use, staging them through host memory, so shared-GPU figures include that copy; gloo has no CUDA
    point-to-point, so a pipeline on CUDA needs a GPU per stage), or None (gloo, each rank where
    `init_parallel` puts it).

    Benchmarks keep one alive across configurations (starting a process that imports torch costs
    seconds); tests keep one per world size (tests/support/distributed.py).

    `pool.run(fn, *args)` calls `fn(rank, world_size, *args)` on every rank (fn must be a module-level
    function so that it pickles) and returns the results in rank order. When a rank raises, dies or
    exceeds the timeout, the pool is killed at once (the other ranks may be stuck in a collective) and
    `WorkerError` carries the reason; open a new pool to go on.
    """

    def __init__(
        self,
        world_size: int,
        threads_per_rank: int,
        timeout_s: float = 3600.0,
        collective_timeout_s: float = 1800.0,
        device: str | None = None,
    ):
        self.world_size = world_size
        self.device = device
        gpus = visible_gpus() if device == "cuda" else 0
        self.backend = check_backend("auto", world_size, gpus, share_gpus=True)
        self.timeout_s = timeout_s
        context = mp.get_context("spawn")
        self._rendezvous_dir = tempfile.TemporaryDirectory(prefix="facetrain-workers-")
        init_method = f"file://{Path(self._rendezvous_dir.name) / 'rendezvous'}"
        self._results = context.Queue()
        self._tasks = [context.Queue() for _ in range(world_size)]
        self._workers = [
            context.Process(
                target=_worker_main,
                args=(
                    rank,
                    world_size,
                    threads_per_rank,
                    collective_timeout_s,
                    init_method,
                    device,
                    self.backend,
                    self._tasks[rank],
                    self._results,
                ),
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
