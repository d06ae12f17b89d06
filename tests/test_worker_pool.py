"""The worker pool (facetrain/parallel/workers.py) over torch elastic's process layer: its ranks get
torchrun's rank environment and an error file, a rank's traceback or exit code reaches WorkerError, and
a rank that dies or hangs takes the pool down at once, without the caller's signal handlers replaced.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from facetrain.parallel.workers import WorkerError, WorkerPool
from tests.support.train_helpers import REPO


def rank_environment(rank: int, world_size: int) -> dict:
    names = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "CUDA_VISIBLE_DEVICES")
    error_file = os.environ.get("TORCHELASTIC_ERROR_FILE", "")
    return {
        **{name: os.environ.get(name) for name in names},
        "error_file": error_file.endswith(f"/{rank}/error.json"),
        "group": (dist.get_rank(), dist.get_world_size()),
    }


def report_rank(rank: int, world_size: int, fail_on: int) -> tuple[int, int]:
    if rank == fail_on:
        raise ValueError(f"rank {rank} was told to fail")
    return rank, world_size


def test_worker_pool_runs_every_rank_and_reports_failures():
    """(Here, not beside bench head, which uses the pool: a rank imports the module of the function it
    runs, and this one imports little more than torch.)"""
    with WorkerPool(2, threads_per_rank=1, timeout_s=60) as pool:
        assert pool.run(report_rank, -1) == [(0, 2), (1, 2)]
        with pytest.raises(WorkerError, match="rank 1 was told to fail"):
            pool.run(report_rank, 1)
        with pytest.raises(WorkerError, match="closed"):
            pool.run(report_rank, -1)


def visible_devices(rank, world_size):
    return os.environ.get("CUDA_VISIBLE_DEVICES"), torch.cuda.is_available()


def test_a_cpu_pool_hides_the_gpus_from_its_ranks():
    """`--device cpu` benchmarks (tests/test_bench_device.py) run in such a pool."""
    with WorkerPool(1, threads_per_rank=1, timeout_s=60, device="cpu") as pool:
        assert pool.backend == "gloo"
        assert pool.run(visible_devices) == [("", False)]


def rank_1_stops(rank: int, world_size: int, how: str) -> None:
    """Rank 1 exits or is killed; rank 0 is stuck, and only the pool can end it (no collective here: a
    gloo rank would fail by itself once its peer is gone, and race the real cause to the pool)."""
    if rank == 0:
        time.sleep(600)
    elif how == "exit":
        sys.exit(3)
    else:
        os.kill(os.getpid(), signal.SIGKILL)


def test_ranks_get_the_rank_environment_and_an_exit_keeps_its_traceback():
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    with WorkerPool(2, threads_per_rank=1, timeout_s=60, collective_timeout_s=60, device="cpu") as pool:
        assert {sig: signal.getsignal(sig) for sig in handlers} == handlers  # torch's are not left here
        assert pool.run(rank_environment) == [
            {
                "RANK": str(rank),
                "LOCAL_RANK": str(rank),
                "WORLD_SIZE": "2",
                "LOCAL_WORLD_SIZE": "2",
                "CUDA_VISIBLE_DEVICES": "",
                "error_file": True,
                "group": (rank, 2),
            }
            for rank in range(2)
        ]
        with pytest.raises(WorkerError) as raised:
            pool.run(rank_1_stops, "exit")
    message = str(raised.value)
    assert message.startswith("rank 1 failed:\nTraceback")
    assert "in rank_1_stops" in message and "SystemExit: 3" in message


def test_a_rank_killed_with_sigkill_stops_the_pool_at_once_and_names_its_exit_code():
    pool = WorkerPool(2, threads_per_rank=1, timeout_s=120, collective_timeout_s=120)
    pool.run(rank_environment)  # started and joined
    started = time.monotonic()
    with pytest.raises(WorkerError) as raised:
        pool.run(rank_1_stops, "kill")
    assert time.monotonic() - started < 30  # not the timeout: rank 0, stuck, was stopped
    assert str(raised.value) == (
        "rank 1 exited with code -9 (SIGKILL: out of memory?) before reporting; the other ranks were stopped"
    )
    with pytest.raises(WorkerError, match="closed"):
        pool.run(rank_environment)
    pool.close()  # once more: nothing left to do


def sleep_for(rank: int, world_size: int, seconds: float) -> None:
    time.sleep(seconds)


def test_a_rank_past_the_timeout_is_killed_and_close_is_idempotent():
    pool = WorkerPool(1, threads_per_rank=1, timeout_s=2)
    started = time.monotonic()
    with pytest.raises(WorkerError, match="no result within 2 s"):
        pool.run(sleep_for, 600)
    assert time.monotonic() - started < 30
    pool.close()
    pool.close()


def leave_a_thread_running(rank: int, world_size: int) -> None:
    threading.Thread(target=time.sleep, args=(600,)).start()  # not a daemon: the rank's exit waits


def test_close_kills_a_rank_that_hangs_on_its_way_out():
    pool = WorkerPool(1, threads_per_rank=1, timeout_s=60)
    pool.run(leave_a_thread_running)
    started = time.monotonic()
    pool.close()
    assert time.monotonic() - started < 20  # a few seconds' grace, not the thread's 600 s
    with pytest.raises(WorkerError, match="closed"):
        pool.run(leave_a_thread_running)


def rank_pid(rank: int, world_size: int) -> int:
    return os.getpid()


def running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def ignore_stop_signals() -> None:
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1):
        signal.signal(sig, signal.SIG_IGN)


@pytest.mark.parametrize("owner_ignores_stop_signals", [False, True])
def test_the_ranks_die_with_the_process_that_started_them(owner_ignores_stop_signals):
    """torch sets each rank's parent-death signal: a pool's owner killed with SIGKILL (which closes
    nothing) leaves no rank behind, waiting for tasks forever, and no warning of leaked semaphores. Also
    when the owner ignores the stop signals (a shell's background job, a process whose `facetrain train`
    has finished), which its ranks would otherwise inherit through exec."""
    owner = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import time\n"
            "from facetrain.parallel.workers import WorkerPool\n"
            "from tests.test_worker_pool import rank_pid\n"
            "print(WorkerPool(1, threads_per_rank=1, timeout_s=60).run(rank_pid)[0], flush=True)\n"
            "time.sleep(600)\n",
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=ignore_stop_signals if owner_ignores_stop_signals else None,
    )
    try:
        rank = int(owner.stdout.readline())
        owner.kill()
        owner.wait(timeout=30)
        deadline = time.monotonic() + 20
        while running(rank) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not running(rank)
        # the owner's resource tracker removes the queues' semaphores without a word
        assert "leaked" not in owner.stderr.read()
    finally:
        owner.kill()
        owner.wait(timeout=30)
