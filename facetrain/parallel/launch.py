"""`--nproc N`: start N local ranks of a function with torch.distributed's elastic launcher.

It is torchrun's own machinery (the same environment, rendezvous and failure handling), so a run
started with `--nproc` and one started under torchrun take one path. The function receives its
arguments as Python objects, not argv strings. When a rank fails the launcher stops the others at once;
the exit code is the first failing rank's.
"""

from __future__ import annotations

import logging
import os
import sys
import uuid
from collections.abc import Callable

from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.launcher.api import LaunchConfig, elastic_launch

# exit code of a rank that has already printed its one-line user error
USER_ERROR_EXIT = 2


def local_threads(nproc: int) -> int:
    """Each rank's share of the cores, so N ranks do not oversubscribe them."""
    return max(1, (os.cpu_count() or 1) // nproc)


def launch_local(nproc: int, entrypoint: Callable[..., object], *args: object) -> int:
    """Run `entrypoint(*args)` as ranks 0..nproc-1 of one group on this machine; return the exit code."""
    config = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=nproc,
        run_id=uuid.uuid4().hex,
        rdzv_backend="c10d",
        rdzv_endpoint="localhost:0",
        max_restarts=0,
        monitor_interval=0.1,
        start_method="spawn",
    )
    # the launcher logs every rank's failure at length; facetrain's ranks explain themselves
    for name in ("torch.distributed.elastic", "torch.multiprocessing.spawn"):
        logging.getLogger(name).setLevel(logging.CRITICAL)
    try:
        elastic_launch(config, entrypoint)(*args)
    except ChildFailedError as error:
        rank, failure = min(error.failures.items(), key=lambda item: item[1].timestamp)
        code = failure.exitcode if failure.exitcode > 0 else 1
        if code != USER_ERROR_EXIT:
            print(f"error: rank {rank} exited with code {failure.exitcode}", file=sys.stderr, flush=True)
        return code
    return 0
