"""A pool of local ranks that runs one function after another, for the benchmarks and the test suite
(tests/support/distributed.py); training's ranks run one function once (`launch.py`).

Both start their ranks through torch elastic's process layer (`local_processes.py`): each rank is a
spawned process with the environment torchrun gives a rank (RANK, LOCAL_RANK, WORLD_SIZE,
LOCAL_WORLD_SIZE) and an error file, runs under torch's `@record`, and dies with the process that
started it. The ranks join through a file rendezvous in a temporary directory, so each rank's memory is
its own process's memory and the collectives are real ones. The backend comes from `dims.check_backend`,
the chooser `launch.py` and `init_parallel` use, and each rank's device from `facetrain.devices` through
`init_parallel`.
"""

from __future__ import annotations

import atexit
import multiprocessing as mp
import os
import queue
import signal
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.distributed.elastic.multiprocessing import PContext, ProcessFailure

from facetrain.parallel.dims import check_backend, destroy_parallel, init_parallel, visible_gpus
from facetrain.parallel.local_processes import start_quiet_resource_tracker, start_ranks

# how often a waiting pool asks torch whether a rank has ended; a rank's failure shows this late at most
_POLL_S = 0.1
# how long closing waits for the ranks to leave the group and exit before killing them
_CLOSE_S = 5.0


class WorkerError(RuntimeError):
    """A rank raised, died or timed out; the pool that ran it is closed."""


def _serve(
    rank: int,
    world_size: int,
    threads: int,
    collective_timeout_s: float,
    init_method: str,
    backend: str,
    tasks,
    results,
) -> None:
    """A rank's life: join the group, then run each task until told to stop (None).

    A task that raises ends the rank: torch's `@record` around this function leaves the traceback in the
    rank's error file, where the pool reads it. A SystemExit or KeyboardInterrupt, which `@record` lets
    through without a traceback (and torch's spawn counts a KeyboardInterrupt as a clean exit), is
    raised again as an error.
    """
    # Python's own handlers, whatever the rank inherited from its owner (a shell's background job
    # ignores SIGINT, a process whose `facetrain train` finished ignores the stop signals): SIGINT is
    # the parent-death signal torch gives a rank, SIGTERM how torch stops a rank when another failed
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    torch.set_num_threads(threads)
    try:
        init_parallel(backend=backend, timeout_s=collective_timeout_s, init_method=init_method)
        while (task := tasks.get()) is not None:
            fn, args = task
            results.put((rank, fn(rank, world_size, *args)))
    except (SystemExit, KeyboardInterrupt) as stop:
        raise WorkerError(f"rank {rank} stopped with {type(stop).__name__}: {stop}") from stop
    destroy_parallel()


class WorkerPool:
    """`world_size` ranks joined through a file rendezvous in a temp dir, on `device`: "cpu" (GPUs
    hidden from the ranks), "cuda" (rank r on GPU r modulo the GPUs visible; nccl when every rank has a
    GPU of its own, else gloo, which takes CUDA tensors for the collectives the head and DDP use, staging
    them through host memory, so shared-GPU figures include that copy; gloo has no CUDA point-to-point,
    so a pipeline on CUDA needs a GPU per stage), or None (gloo, each rank where `init_parallel` puts
    it).

    Benchmarks keep one alive across configurations (starting a process that imports torch costs
    seconds); tests keep one per world size (tests/support/distributed.py).

    `pool.run(fn, *args)` calls `fn(rank, world_size, *args)` on every rank (fn must be a module-level
    function so that it pickles) and returns the results in rank order. When a rank raises, dies or
    exceeds the timeout, the pool is killed at once (the other ranks may be stuck in a collective) and
    `WorkerError` carries the reason: the rank's traceback from its error file, or its exit code; open
    a new pool to go on.
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
        self._folder = tempfile.TemporaryDirectory(prefix="facetrain-workers-")
        init_method = f"file://{Path(self._folder.name) / 'rendezvous'}"
        start_quiet_resource_tracker()  # before the queues' semaphores, which it will see
        context = mp.get_context("spawn")
        self._results = context.Queue()
        self._tasks = [context.Queue() for _ in range(world_size)]
        rank_env = {"WORLD_SIZE": str(world_size), "LOCAL_WORLD_SIZE": str(world_size)}
        if device == "cpu":  # init_parallel places a rank on a GPU whenever it sees one
            rank_env["CUDA_VISIBLE_DEVICES"] = ""
        self._ranks: PContext | None = start_ranks(
            "workers",
            _serve,
            args={
                rank: (
                    rank,
                    world_size,
                    threads_per_rank,
                    collective_timeout_s,
                    init_method,
                    self.backend,
                    self._tasks[rank],
                    self._results,
                )
                for rank in range(world_size)
            },
            envs={
                rank: {**rank_env, "RANK": str(rank), "LOCAL_RANK": str(rank)} for rank in range(world_size)
            },
            log_dir=str(Path(self._folder.name) / "ranks"),
        )
        _OPEN.add(self)

    def run(self, fn: Callable[..., Any], *args: Any) -> list[Any]:
        if self._ranks is None:
            raise WorkerError("the worker pool is closed")
        for task_queue in self._tasks:
            task_queue.put((fn, args))
        outcomes: dict[int, Any] = {}
        deadline = time.monotonic() + self.timeout_s
        while len(outcomes) < self.world_size:
            try:
                rank, result = self._results.get(timeout=_POLL_S)
            except queue.Empty:
                self._stop_on_failure(deadline)
                continue
            outcomes[rank] = result
        return [outcomes[rank] for rank in range(self.world_size)]

    def _stop_on_failure(self, deadline: float) -> None:
        """Raise WorkerError, the ranks gone, when one has ended or the deadline has passed.

        torch reports the first rank it sees ended and stops the others with SIGTERM (which ends a rank
        at once unless a task left a handler for it installed; then SIGKILL 30 s later)."""
        assert self._ranks is not None
        ended = self._ranks.wait(timeout=0)
        if ended is None and time.monotonic() <= deadline:
            return
        if ended is None:
            self._ranks.close(death_sig=signal.SIGKILL, timeout=int(_CLOSE_S))
            reason = f"no result within {self.timeout_s:.0f} s"
        else:
            reason = _failure_reason(ended.failures)
        self._release()
        raise WorkerError(reason)

    def close(self) -> None:
        """Let the ranks leave the group and exit; kill those that have not within a few seconds."""
        if self._ranks is None:
            return
        for task_queue in self._tasks:
            task_queue.put(None)
        # torch waits without a limit for ranks that have returned to exit; one that hangs on its way
        # out (a thread it left behind) is killed
        stuck = threading.Timer(_CLOSE_S, _kill, (list(self._ranks.pids().values()),))
        stuck.start()
        try:
            if self._ranks.wait(timeout=_CLOSE_S, period=_POLL_S / 2) is None:
                self._ranks.close(death_sig=signal.SIGKILL, timeout=int(_CLOSE_S))
        finally:
            stuck.cancel()
        self._release()

    def _release(self) -> None:
        self._ranks = None
        _OPEN.discard(self)
        self._folder.cleanup()

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


def _kill(pids) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _failure_reason(failures: dict[int, ProcessFailure]) -> str:
    """Why the rank torch saw end first ended: the traceback `@record` left in its error file, else its
    exit code. (A one-line message a task's code left there, `record_user_error`, may be an earlier
    task's, so it is not read.)"""
    rank, failure = min(failures.items())
    message = failure.message
    if isinstance(message, dict):  # @record's: {"message": "Error: ...", "extraInfo": {"py_callstack"}}
        return f"rank {rank} failed:\n{message['extraInfo']['py_callstack']}"
    if failure.exitcode == -signal.SIGKILL:
        how = " (SIGKILL: out of memory?)"
    elif failure.exitcode < 0:
        how = f" ({failure.signal_name()})"
    else:
        how = ""
    return (
        f"rank {rank} exited with code {failure.exitcode}{how} before reporting; the other ranks were stopped"
    )


# Pools not closed yet: torch's ranks are not daemons, and Python waits for them when it exits.
_OPEN: set[WorkerPool] = set()


@atexit.register
def _close_open_pools() -> None:
    for pool in list(_OPEN):
        pool.close()
