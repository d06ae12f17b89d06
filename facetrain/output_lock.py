"""One writer at a time of an output folder that is not a run's (a packed set): a lock file taken as a
run's is (`run_lock`: an exclusive `flock` that dies with its process, its content naming the holder
for the message that refuses a second writer), and removed on release, so a finished command leaves
nothing beside its output.

Removing a lock file races with a process that opened it just before: that one would lock a file no
longer in the folder while a third creates and locks a new one. So a lock counts only when the file
locked is still the one at the path, and is taken again otherwise.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from facetrain.run_lock import RunDirBusy, _busy_message, _holder


@contextmanager
def output_lock(folder: Path, name: str, command: str, advice: str) -> Iterator[None]:
    """Hold `folder/name` for the block; a second holder is refused in one line naming the first."""
    path = folder / name
    while True:
        descriptor = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(descriptor)
            raise RunDirBusy(_busy_message(folder, _holder(path), advice)) from None
        try:
            current = os.stat(path, follow_symlinks=False).st_ino
        except FileNotFoundError:
            current = None
        if current == os.fstat(descriptor).st_ino:
            break
        os.close(descriptor)  # its last holder removed it between our open and our lock
    holder = {"pid": os.getpid(), "host": socket.gethostname(), "command": command,
              "since": time.strftime("%Y-%m-%dT%H:%M:%S%z")}  # fmt: skip
    os.pwrite(descriptor, (json.dumps(holder) + "\n").encode(), 0)
    try:
        yield
    finally:
        path.unlink(missing_ok=True)
        os.close(descriptor)
