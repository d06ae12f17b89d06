"""The one way tests run multi-rank code: facetrain's worker pool of spawned gloo processes.

`run_distributed(fn, world_size, *args)` calls `fn(rank, world_size, *args)` in every worker and returns
the results in rank order. A worker that raises fails the test with its traceback; workers that do not
finish within `timeout` seconds are killed and the test fails, so a hang never blocks the suite.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from facetrain.bench.workers import WorkerPool


def run_distributed(fn: Callable, world_size: int, *args: Any, timeout: float = 120.0) -> list[Any]:
    with WorkerPool(world_size, threads_per_rank=1, timeout_s=timeout, collective_timeout_s=60) as pool:
        return pool.run(fn, *args)
