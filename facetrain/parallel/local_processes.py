"""The one way facetrain starts processes on this machine: torch elastic's process layer
(`torch.distributed.elastic.multiprocessing`), the layer torchrun's agent stands on.

Training's `--nproc` (`launch.py`) reaches it through `elastic_launch`, whose agent adds a rendezvous and
restarts; the worker pool (`workers.py`) calls `start_ranks` here directly, since its ranks outlive one
function. Either way each rank runs under torch's `@record`, which leaves an unexpected error's traceback
in the rank's error file (`TORCHELASTIC_ERROR_FILE`, under the folder given), and torch reports a rank
that dies, stops the others and kills what does not stop. What the two share is here: torch's logs kept
quiet and the quiet resource tracker.
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
from collections.abc import Callable
from multiprocessing import resource_tracker

from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, PContext, start_processes


def quiet_torch_elastic() -> None:
    """torch elastic logs every rank's failure at length, and each process it stops; facetrain's ranks
    explain themselves, and its launchers say which rank failed in one line."""
    for name in ("torch.distributed.elastic", "torch.multiprocessing.spawn"):
        logging.getLogger(name).setLevel(logging.CRITICAL)


def start_quiet_resource_tracker() -> None:
    """Start Python's resource tracker for this process with its leak warning off.

    torch elastic makes named semaphores here for the ranks' results (9 under the launcher), and the
    worker pool its queues. A process killed with SIGKILL cannot remove them; its tracker, which
    outlives it, does, and then warned of "leaked semaphore objects" under the user's last line, for a
    cleanup that went as it should. The tracker takes its warning filters from this process's `-W`
    options when it starts, so the option is set for that moment only: the ranks, spawned later, keep
    Python's defaults. (Ranks make no named semaphores: `data.loader_workers.platform_context`,
    `progress.ProgressBar`'s lock.)
    """
    option = "ignore:resource_tracker:UserWarning"
    sys.warnoptions.append(option)
    try:
        resource_tracker.ensure_running()
    finally:
        sys.warnoptions.remove(option)


def start_ranks(
    name: str,
    entrypoint: Callable[..., object],
    args: dict[int, tuple],
    envs: dict[int, dict[str, str]],
    log_dir: str,
) -> PContext:
    """`entrypoint(*args[r])` in a spawned process per rank r, with `envs[r]` added to its environment
    and its error file at `log_dir/<id>/attempt_0/<r>/error.json`; poll it with `wait(timeout=0)`.

    torch registers its own handlers for the signals TORCHELASTIC_SIGNALS_TO_HANDLE names (SIGTERM,
    SIGINT, SIGHUP and SIGQUIT when unset) in the process that starts ranks, raising its `SignalException`, as an agent wants; a caller that is not an agent (a test
    session, a benchmark) keeps its own. The ranks die with this process: torch sets their parent-death
    signal (SIGINT).
    """
    quiet_torch_elastic()
    start_quiet_resource_tracker()
    in_main_thread = threading.current_thread() is threading.main_thread()
    handled = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)
    previous = {sig: signal.getsignal(sig) for sig in handled} if in_main_thread else {}
    try:
        return start_processes(
            name=name,
            entrypoint=entrypoint,
            args=args,
            envs=envs,
            logs_specs=DefaultLogsSpecs(log_dir=log_dir),
            start_method="spawn",
        )
    finally:
        for sig, handler in previous.items():
            if handler is not None:  # None: installed outside Python, which cannot put it back
                signal.signal(sig, handler)
