"""`--nproc N`: start N local ranks of a function with torch.distributed's elastic launcher.

It is torchrun's own machinery (the same environment, rendezvous and failure handling), so a run
started with `--nproc` and one started under torchrun take one path. The function receives its
arguments as Python objects, not argv strings. The agent starts the ranks with torch elastic's
`start_processes`, as the worker pool of the benchmarks and tests does (`workers.py`); what the two
share, torch's logs kept quiet and the quiet resource tracker, is in `local_processes.py`.

When ranks fail, the user sees one cause, last. Each rank runs under torch elastic's `@record`
(`facetrain.train.rank.train_rank`), which leaves an unexpected error's traceback in the rank's error
file (`TORCHELASTIC_ERROR_FILE`); a rank that fails with a user error records its one-line message there
instead (`record_user_error`), with a kind: `cause` (this rank's own problem), `every_rank` (the same on
every rank) or `peer` (this rank stopped because another failed), so torchrun's own summary shows the
message too. The launcher reads every rank's file after all have exited: torch's agent keeps only the
first failure it sees, which is often a bystander. The launcher prints the first `cause` after a
one-line summary, and a `peer` message only when nothing better explains the failure, so a bystander is
never blamed.

With nccl (`parallel.backend` nccl, or auto on a machine with GPUs) more ranks than visible GPUs are
refused in one line before any rank starts: NCCL cannot put two ranks on one GPU.

A SIGTERM, SIGINT or SIGUSR1 sent to the launcher is passed on to the ranks, which stop at the next step
boundary, write a checkpoint and exit 0; the launcher then exits 0 as well. A launcher killed with
SIGKILL cannot pass anything on: each rank then stops by itself and exits within `timeout_s`
(`launcher_watch.py`).
"""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import signal
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure
from torch.distributed.launcher.api import LaunchConfig, elastic_launch

from facetrain.errors import EveryRankError, FacetrainError, PeerFailed, PeerLost
from facetrain.logger import logger
from facetrain.parallel.dims import check_backend, visible_gpus
from facetrain.parallel.launcher_watch import run_watched
from facetrain.parallel.local_processes import quiet_torch_elastic, start_quiet_resource_tracker

# exit code of a rank that has reported its one-line user error
USER_ERROR_EXIT = 2
LAUNCHED_ENV = "FACETRAIN_LAUNCHED_LOCALLY"
SIGNALS_TO_HANDLE_ENV = "TORCHELASTIC_SIGNALS_TO_HANDLE"


def local_threads(nproc: int) -> int:
    """Each rank's share of the cores, so N ranks do not oversubscribe them."""
    return max(1, (os.cpu_count() or 1) // nproc)


def rank_threads() -> int:
    """A `--nproc` rank's intra-op threads: OMP_NUM_THREADS where set, else its share of the cores (a
    forked rank starts with its launcher's one thread, a spawned one with every core)."""
    threads = os.environ.get("OMP_NUM_THREADS")
    return int(threads) if threads else local_threads(int(os.environ["LOCAL_WORLD_SIZE"]))


def launched_locally() -> bool:
    """Whether this rank was started by `launch_local`, which prints the ranks' errors itself."""
    return LAUNCHED_ENV in os.environ


def _failure_kind(error: FacetrainError) -> str:
    """`peer` for a rank that stopped because another failed, `every_rank` for an error every rank sees
    alike, else `cause`: how the launcher weighs the rank's line against the others'."""
    if isinstance(error, (PeerFailed, PeerLost)):
        return "peer"
    if isinstance(error, EveryRankError):
        return "every_rank"
    return "cause"


def record_user_error(error: FacetrainError) -> None:
    """Leave this rank's one-line error and its kind in its error file, where the launcher (or torchrun)
    looks for it, in place of the traceback `@record` left there; nothing outside torch elastic."""
    if "TORCHELASTIC_ERROR_FILE" not in os.environ:
        return
    record = {
        "message": str(error),
        "timestamp": int(time.time()),
        "facetrain": {"kind": _failure_kind(error), "time": time.time()},
    }
    try:
        Path(os.environ["TORCHELASTIC_ERROR_FILE"]).write_text(json.dumps(record))
    except OSError:
        pass  # the launcher then reports the exit code alone


def _forward_stop_signals() -> dict:
    """SIGTERM/SIGINT/SIGUSR1 to the launcher go to the ranks, which stop gracefully; returns the old
    handlers."""

    def forward(signum: int, frame) -> None:
        ranks = multiprocessing.active_children()
        if not ranks:  # nothing started yet: stop at once
            raise SystemExit(128 + signum)
        for rank in ranks:
            try:
                os.kill(rank.pid, signum)
            except ProcessLookupError:
                pass

    return {sig: signal.signal(sig, forward) for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)}


def launch_local(
    nproc: int,
    entrypoint: Callable[..., object],
    *args: object,
    backend: str | None = None,
    timeout_s: float = 300.0,
    fork: bool = False,
) -> int:
    """Run `entrypoint(*args)` as ranks 0..nproc-1 of one group on this machine; return the exit code.

    `backend` (parallel.backend) is checked against the visible GPUs first (`dims.check_backend`).
    `timeout_s` (parallel.timeout_s) bounds how long a rank outlives this process if it is killed.
    `fork`: the ranks are forked from this process where no GPU is visible, so they start from its
    imports (torch and facetrain's training stack, 4-5 s of a core per rank, more than a tiny run's
    training) instead of importing them again. The caller allows it only if it has run every tensor
    operation on one thread (`torch.set_num_threads(1)` before the first): once OpenMP ran a parallel
    region here, a forked rank's first parallel region hangs (GNU libgomp). Where a GPU is visible the
    ranks are spawned: CUDA, once initialised here (counting the GPUs may), is unusable in a forked child.
    """
    if backend is not None:
        check_backend(backend, nproc, visible_gpus())
    reports = tempfile.mkdtemp(prefix="facetrain-ranks-")
    config = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=nproc,
        run_id=uuid.uuid4().hex,
        rdzv_backend="c10d",
        rdzv_endpoint="localhost:0",
        max_restarts=0,
        monitor_interval=0.1,
        start_method="fork" if fork and not visible_gpus() else "spawn",
        signals_to_handle="SIGHUP,SIGQUIT",  # SIGTERM, SIGINT and SIGUSR1 are forwarded, not fatal
        logs_specs=DefaultLogsSpecs(log_dir=reports),  # <run>/attempt_0/<rank>/error.json
    )
    quiet_torch_elastic()
    start_quiet_resource_tracker()
    previous = _forward_stop_signals()
    # elastic_launch leaves `signals_to_handle` in this process's environment, where a later
    # start_processes here (a worker pool) would then take SIGTERM and SIGINT as not its to handle
    signals_env = os.environ.get(SIGNALS_TO_HANDLE_ENV)
    try:
        os.environ[LAUNCHED_ENV] = "1"  # the ranks inherit it
        try:
            elastic_launch(config, run_watched)(entrypoint, os.getpid(), timeout_s, *args)
        except ChildFailedError as error:
            lines, code = explain_failures(error.failures, _read_reports(Path(reports)), nproc)
            for line in lines:
                logger.error(line)
            return code
    finally:
        del os.environ[LAUNCHED_ENV]
        if signals_env is None:
            os.environ.pop(SIGNALS_TO_HANDLE_ENV, None)
        else:
            os.environ[SIGNALS_TO_HANDLE_ENV] = signals_env
        shutil.rmtree(reports, ignore_errors=True)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 0


def recorded_traceback(failure: ProcessFailure) -> list[str]:
    """The lines of the traceback `@record` left in a rank's error file. The launcher prints them: a
    rank's own stderr did not reach the user, who read "its traceback is above" under nothing."""
    message = (getattr(failure, "error_file_data", None) or {}).get("message")
    stack = message.get("extraInfo", {}).get("py_callstack") if isinstance(message, dict) else None
    return stack.rstrip().splitlines() if isinstance(stack, str) else []


def _read_reports(folder: Path) -> dict[int, dict]:
    """rank -> {"message", "facetrain": {"kind", "time"}} for every rank that recorded its failure (one
    node: the local rank of torch's error-file folder is the rank)."""
    reports = {}
    for path in folder.glob("*/attempt_*/*/error.json"):
        try:
            report = json.loads(path.read_text())
            if "facetrain" in report:  # not a traceback @record left
                reports[int(path.parent.name)] = report
        except (OSError, ValueError):
            continue
    return reports


def explain_failures(
    failures: dict[int, ProcessFailure], reports: dict[int, dict], world_size: int
) -> tuple[list[str], int]:
    """The lines to print, the root cause last, and the launcher's exit code.

    `failures` is what torch's agent saw first (exit code or signal); `reports` what ranks recorded.
    """

    def first(kind: str) -> int | None:
        ranks = [r for r, report in reports.items() if report["facetrain"]["kind"] == kind]
        return min(ranks, key=lambda r: reports[r]["facetrain"]["time"]) if ranks else None

    def others(rank: int) -> list[int]:
        return sorted(set(range(world_size)) - {rank})

    every_rank, cause, peer = first("every_rank"), first("cause"), first("peer")
    if every_rank is not None:
        return [f"error: {reports[every_rank]['message']}"], USER_ERROR_EXIT
    if cause is not None:
        return [
            f"error: rank {cause} of {world_size} failed; stopped ranks {others(cause)}",
            f"[rank {cause}] error: {reports[cause]['message']}",
        ], USER_ERROR_EXIT
    killed = [r for r, failure in failures.items() if failure.exitcode < 0 and r not in reports]
    if killed or peer is None:
        rank = min(killed or failures)
        failure = failures[rank]
        traceback = []
        if failure.exitcode < 0:
            how = f"exited with code {failure.exitcode} ({failure.signal_name()}: killed, or out of memory)"
        else:
            traceback = recorded_traceback(failure)
            how = f"exited with code {failure.exitcode} ({'its traceback is above' if traceback else 'no traceback was recorded'})"
        code = failure.exitcode if failure.exitcode > 0 else 1
        return [*traceback, f"error: rank {rank} {how}; stopped ranks {others(rank)}"], code
    return [f"[rank {peer}] error: {reports[peer]['message']}"], USER_ERROR_EXIT
