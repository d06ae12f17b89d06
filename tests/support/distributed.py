"""The one way tests run multi-rank code: facetrain's worker pool of gloo ranks (facetrain/parallel/workers.py),
started by torch elastic as a training rank is, with torchrun's rank environment (RANK, WORLD_SIZE, ...).

`run_distributed(fn, world_size, *args)` calls `fn(rank, world_size, *args)` in every worker and returns
the results in rank order. A worker that raises fails the test with its traceback (from the rank's error file); workers that do not
finish within `timeout` seconds are killed and the test fails, so a hang never blocks the suite.

Starting a pool costs seconds per rank (each spawned process imports torch and joins the group), more
than most tests' own work, so one pool per world size serves the session's tests one after another.
Each call starts from the state a fresh pool's rank has: before it runs, every rank puts back its
random generators, thread count, deterministic-algorithms flag, default dtype and environment as they
were when the rank first ran a test. A pool whose rank failed, timed out or left the process group
is closed and the next call starts a new one.
"""

from __future__ import annotations

import atexit
import os
import random
import socket
import threading
from collections.abc import Callable
from typing import Any

import numpy
import torch

from facetrain.parallel.workers import WorkerError, WorkerPool

_POOLS: dict[int, WorkerPool] = {}
# In each rank: the state it had before its first test (None until then).
_FRESH: dict[str, Any] | None = None


def run_distributed(fn: Callable, world_size: int, *args: Any, timeout: float = 120.0) -> list[Any]:
    pool = _POOLS.pop(world_size, None) or WorkerPool(
        world_size, threads_per_rank=1, timeout_s=timeout, collective_timeout_s=60
    )
    pool.timeout_s = timeout
    try:
        outcomes = pool.run(_as_in_a_fresh_rank, fn, *args)
    except WorkerError:  # the pool closed itself
        raise
    except BaseException:
        pool.close()
        raise
    if all(reusable for reusable, _ in outcomes):
        _POOLS[world_size] = pool
    else:
        pool.close()
    return [result for _, result in outcomes]


def _as_in_a_fresh_rank(rank: int, world_size: int, fn: Callable, *args: Any) -> tuple[bool, Any]:
    """`fn(rank, world_size, *args)` from a fresh rank's state; whether this rank can serve another test."""
    global _FRESH
    if _FRESH is None:
        _FRESH = {
            "torch": torch.get_rng_state(),
            "random": random.getstate(),
            "numpy": numpy.random.get_state(),
            "threads": torch.get_num_threads(),
            "deterministic": torch.are_deterministic_algorithms_enabled(),
            "warn_only": torch.is_deterministic_algorithms_warn_only_enabled(),
            "dtype": torch.get_default_dtype(),
            "environ": dict(os.environ),
        }
    else:
        torch.set_rng_state(_FRESH["torch"])
        random.setstate(_FRESH["random"])
        numpy.random.set_state(_FRESH["numpy"])
        torch.set_num_threads(_FRESH["threads"])
        deterministic = _FRESH["deterministic"], _FRESH["warn_only"]
        now = (
            torch.are_deterministic_algorithms_enabled(),
            torch.is_deterministic_algorithms_warn_only_enabled(),
        )
        if now != deterministic:  # the call costs seconds the first time, so only when a test changed it
            torch.use_deterministic_algorithms(deterministic[0], warn_only=deterministic[1])
        torch.set_default_dtype(_FRESH["dtype"])
        os.environ.clear()
        os.environ.update(_FRESH["environ"])
    result = fn(rank, world_size, *args)
    still_joined = torch.distributed.is_initialized() and torch.distributed.get_world_size() == world_size
    return still_joined, result


@atexit.register
def _close_pools() -> None:
    """Each pool's ranks leave the group and exit (seconds each), all pools at once."""
    closing = [threading.Thread(target=pool.close) for pool in _POOLS.values()]
    _POOLS.clear()
    for thread in closing:
        thread.start()
    for thread in closing:
        thread.join()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]
