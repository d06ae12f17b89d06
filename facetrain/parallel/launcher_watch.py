"""A rank of a `--nproc` or torchrun run outlives its launcher by at most `parallel.timeout_s`.

Killed with SIGKILL (the OOM killer, `kill -9`, a scheduler), or by a signal torchrun's agent does not
handle (SIGUSR1 unless `--signals-to-handle` names it), the launcher cannot stop its ranks. torchrun's
ranks are never told. Under `--nproc` torch asks the kernel to send each rank SIGINT when its parent
dies (PR_SET_PDEATHSIG, Linux only), and facetrain's ranks take SIGINT as a stop request: they agree
on a step, write a checkpoint and return. But torch's rank wrapper then waits, forever and deaf to
signals, for the launcher to read the return value; and a rank blocked elsewhere (a write to a pipe
nobody reads, a collective) never reaches a step boundary at all. Both left the ranks running as orphans, and a `--resume auto` of the same run beside
them.

So each rank watches its parent from a daemon thread. When the launcher is gone it asks the rank to
stop (SIGTERM, for systems without PR_SET_PDEATHSIG), and ends the process at once if the rank's work
has returned, or after `parallel.timeout_s` if the rank is still stopping. Nothing is printed from the
watch: the rank's stderr may be a pipe that nobody reads any more.
"""

from __future__ import annotations

import os
import signal
import threading
import time

POLL_SECONDS = 0.2
# exit codes of a rank ended by the watch: its work had returned, or it was still stopping
FINISHED_EXIT = 0
ABANDONED_EXIT = 1


class LauncherWatch:
    """Ends this process after `launcher_pid` (its parent) exits; see the module docstring."""

    def __init__(self, launcher_pid: int, grace_s: float):
        self.launcher_pid, self.grace_s = launcher_pid, grace_s
        self._finished = threading.Event()

    def start(self) -> LauncherWatch:
        threading.Thread(target=self._watch, name="facetrain-launcher-watch", daemon=True).start()
        return self

    def finished(self) -> None:
        """The rank's work has returned: from now on, only the launcher reading its result is awaited."""
        self._finished.set()

    def _watch(self) -> None:
        while os.getppid() == self.launcher_pid:
            time.sleep(POLL_SECONDS)
        if not self._finished.is_set():
            os.kill(os.getpid(), signal.SIGTERM)
        finished_in_time = self._finished.wait(self.grace_s)
        os._exit(FINISHED_EXIT if finished_in_time else ABANDONED_EXIT)


def run_watched(entrypoint, launcher_pid: int, grace_s: float, *args: object) -> object:
    """`entrypoint(*args)` in a rank that ends within `grace_s` of its launcher's death."""
    watch = LauncherWatch(launcher_pid, grace_s).start()
    result = entrypoint(*args)
    watch.finished()  # a rank that raised is left to its own exit, or to the grace period
    return result
