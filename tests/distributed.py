"""The one way tests run multi-rank code: spawned CPU processes joined by gloo through a file rendezvous.

`run_distributed(fn, world_size, *args)` calls `fn(rank, world_size, *args)` in every worker and returns
the results in rank order. A worker that raises fails the test with its traceback; workers that do not
finish within `timeout` seconds are killed and the test fails, so a hang never blocks the suite.
"""

from __future__ import annotations

import multiprocessing as mp
import pickle
import queue
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any


def _worker(fn: Callable, rank: int, world_size: int, init_method: str, results, args: tuple) -> None:
    import torch

    from facetrain.parallel.env import destroy_distributed, init_distributed

    torch.set_num_threads(1)
    try:
        init_distributed("gloo", timeout_s=60, rank=rank, world_size=world_size, init_method=init_method)
        results.put((rank, True, pickle.dumps(fn(rank, world_size, *args))))
    except BaseException:
        results.put((rank, False, traceback.format_exc()))
    finally:
        destroy_distributed()


def run_distributed(fn: Callable, world_size: int, *args: Any, timeout: float = 120.0) -> list[Any]:
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        init_method = f"file://{Path(tmp) / 'rendezvous'}"
        workers = [
            ctx.Process(target=_worker, args=(fn, rank, world_size, init_method, results, args), daemon=True)
            for rank in range(world_size)
        ]
        for worker in workers:
            worker.start()
        outcomes: dict[int, tuple[bool, Any]] = {}
        deadline = time.monotonic() + timeout
        try:
            while len(outcomes) < world_size:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise AssertionError(
                        f"workers {sorted(set(range(world_size)) - set(outcomes))} timed out"
                    )
                try:
                    rank, ok, payload = results.get(timeout=min(remaining, 1.0))
                    outcomes[rank] = (ok, payload)
                except queue.Empty:
                    dead = [r for r, w in enumerate(workers) if not w.is_alive() and r not in outcomes]
                    if dead and all(not w.is_alive() for w in workers):
                        raise AssertionError(f"workers {dead} died without reporting") from None
        finally:
            for worker in workers:
                worker.join(timeout=5)
                if worker.is_alive():
                    worker.kill()
    failures = [f"rank {r}:\n{payload}" for r, (ok, payload) in sorted(outcomes.items()) if not ok]
    if failures:
        raise AssertionError("\n".join(failures))
    return [pickle.loads(outcomes[r][1]) for r in range(world_size)]
