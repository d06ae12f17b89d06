"""One writer at a time in a run directory: an exclusive OS lock that dies with its process.

Two runs writing into one directory interleave their metrics and overwrite each other's checkpoints,
and both exit 0. So whatever writes into a run directory (training and resuming on rank 0, an eval
report, an export) first takes `LOCK_NAME` there with `flock`. The kernel drops the lock when the
holder exits, however it dies, so a crashed run never leaves a stale lock behind; the file itself stays
and only records who held it last (PID, host, command, time), for the message that refuses a second
writer.

A lock is a property of the process, and the process holds at most one per directory, so held locks
are kept here by directory rather than passed around.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from pathlib import Path

from facetrain.errors import FacetrainError

LOCK_NAME = ".facetrain-lock"

_held: dict[Path, int] = {}


class RunDirBusy(FacetrainError):
    """Another process holds the run directory's lock; the message names its PID and host."""


def acquire(run_dir: Path, command: str, advice: str) -> None:
    """Take `run_dir`'s lock for this process, until `release` or the process's end.

    Refuses in one line naming the holder, ending with `advice` (what the user can do instead). The
    directory must exist; OSError (a read-only folder, say) is left to the caller, which knows what it
    was about to write.
    """
    key = run_dir.resolve()
    if key in _held:
        raise RunDirBusy(_busy_message(run_dir, _holder(key / LOCK_NAME), advice))
    descriptor = os.open(key / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(descriptor)
        raise RunDirBusy(_busy_message(run_dir, _holder(key / LOCK_NAME), advice)) from None
    except BaseException:
        os.close(descriptor)
        raise
    holder = {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "command": command,
        "since": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    os.ftruncate(descriptor, 0)
    os.pwrite(descriptor, (json.dumps(holder) + "\n").encode(), 0)
    _held[key] = descriptor


def release(run_dir: str | Path) -> None:
    """Give up `run_dir`'s lock if this process holds it (a no-op otherwise)."""
    descriptor = _held.pop(Path(run_dir).resolve(), None)
    if descriptor is not None:
        fcntl.flock(descriptor, fcntl.LOCK_UN)  # also for forked children sharing the descriptor
        os.close(descriptor)


def holds(run_dir: Path) -> bool:
    return run_dir.resolve() in _held


def _holder(path: Path) -> dict:
    """Who holds the lock, as it wrote into the file; briefly retried, as the holder writes it just
    after taking the lock."""
    for _ in range(20):
        try:
            holder = json.loads(path.read_text())
            if isinstance(holder, dict) and "pid" in holder:
                return holder
        except (OSError, ValueError):
            pass
        time.sleep(0.05)
    return {}


def _busy_message(run_dir: Path, holder: dict, advice: str) -> str:
    if holder:
        who = (
            f"{holder.get('command', 'facetrain')} (PID {holder['pid']} on host {holder.get('host', '?')}, "
            f"since {holder.get('since', '?')})"
        )
    else:
        who = "another facetrain process"
    return f"{run_dir} is in use by {who}; {advice}"
