"""How facetrain's DataLoader workers start, and what they do with stop signals.

A scheduler stops a job by signalling every process of it at once: Slurm at `scancel`, at the time
limit and at preemption, torchrun's agent with `killpg`, `timeout` and a shell's job control to the
whole process group. A loader worker is in that group. torch's own SIGTERM handler in each worker ends
the worker when the signal came from anyone but its parent, and the training process then failed
mid-step with "DataLoader worker (pid N) is killed by signal: Terminated", losing every step since the
last checkpoint. So a worker ignores SIGINT and SIGUSR1, and takes SIGTERM only from its parent: the
training process catches the stop signals itself, stops at the next step boundary, writes its
checkpoint and shuts its workers down. A SIGTERM from the parent still ends a worker at once (what
Python and torch send a worker that did not finish its shutdown, at exit), a worker whose parent is gone
exits by itself, and SIGKILL ends it at once. A worker is started with the stop signals blocked, so
one that arrives while it starts (workers start again at every epoch) waits for the worker's own
handling instead of meeting torch's handler first.

Workers start the way the platform starts processes by default (fork on Linux): a rank torchrun starts
(or `--nproc` where a GPU is visible) is a spawned process, and Python makes spawn the default inside
those, which cost a fresh interpreter importing torch for every worker at every epoch (16-18 s an epoch
on 2 cores).
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading

import cv2

# what facetrain's training process takes as "stop after this step"
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)


_DEFAULT_CONTEXT = multiprocessing.get_context(multiprocessing.get_all_start_methods()[0])


def platform_context() -> multiprocessing.context.BaseContext:
    """The platform's default way to start processes (fork on Linux), even inside a spawned rank, where
    Python's default is spawn. Besides the start-up cost, spawn's locks and queues are named semaphores
    that a rank killed with SIGKILL leaves for its launcher's resource tracker to clean up, with a warning
    of "leaked semaphore objects"; fork's are unlinked at once."""
    return _DEFAULT_CONTEXT


class _WorkerProcess(_DEFAULT_CONTEXT.Process):
    """A process that starts with the stop signals blocked (a child inherits its parent's mask)."""

    def start(self) -> None:
        previous = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
        try:
            super().start()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, previous)


class _WorkerContext(type(_DEFAULT_CONTEXT)):
    Process = _WorkerProcess


def worker_context() -> multiprocessing.context.BaseContext:
    """The platform's default way to start processes, even inside a spawned process, with the stop
    signals blocked in the new process until `init_loader_worker` has taken them."""
    return _WorkerContext()


def init_loader_worker(worker_id: int) -> None:
    """Stop signals are the training process's (see the module docstring); decoding runs on one core:
    OpenCV's own thread pool in every worker would oversubscribe the CPU."""
    for sig in STOP_SIGNALS:
        if sig != signal.SIGTERM:
            signal.signal(sig, signal.SIG_IGN)
    # SIGTERM stays blocked, for a thread that ends the worker if its parent sent it; the worker has
    # one thread here, and threads it starts later inherit the mask
    signal.pthread_sigmask(signal.SIG_SETMASK, {signal.SIGTERM})
    threading.Thread(target=_end_on_parents_sigterm, args=(os.getppid(),), daemon=True).start()
    cv2.setNumThreads(0)


def _end_on_parents_sigterm(parent: int) -> None:
    while True:
        if signal.sigwaitinfo({signal.SIGTERM}).si_pid == parent:
            os._exit(0)  # as torch's own handler does for its parent's SIGTERM
