"""What every DataLoader worker facetrain starts does first: leave stop signals to the process it serves.

A scheduler stops a job by signalling every process of it at once: Slurm at `scancel`, at the time
limit and at preemption, torchrun's agent with `killpg`, `timeout` and a shell's job control to the
whole process group. A loader worker is in that group. torch installs its own SIGTERM handler in each
worker, which ends the worker when the signal came from anyone but its parent, and the training process
then fails mid-step with "DataLoader worker (pid N) is killed by signal: Terminated", losing every step
since the last checkpoint. So a worker ignores the stop signals; the training process catches them,
stops at the next step boundary and writes its checkpoint, and shuts its workers down as always (a
worker whose parent is gone exits by itself, and SIGKILL still ends it at once).
"""

from __future__ import annotations

import signal

import cv2

# what facetrain's training process takes as "stop after this step"; its workers ignore them
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)


def init_loader_worker(worker_id: int) -> None:
    """A worker ignores stop signals (see the module docstring) and decodes on one core: OpenCV's own
    thread pool in every worker would oversubscribe the CPU."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    cv2.setNumThreads(0)
