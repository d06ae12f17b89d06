"""`--nproc N`: start N local ranks of the same command, as torchrun would, and watch them.

If one rank fails, the others are stopped within seconds instead of waiting in a collective until its
timeout; the exit code is the failing rank's.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

GRACE_SECONDS = 5.0


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def launch_local(nproc: int, argv: list[str]) -> int:
    """Run `python -m facetrain <argv>` as ranks 0..nproc-1 of one group on this machine."""
    port = _free_port()
    threads = max(1, (os.cpu_count() or 1) // nproc)
    ranks = []
    for rank in range(nproc):
        env = {
            **os.environ,
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": str(nproc),
            "LOCAL_WORLD_SIZE": str(nproc),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", str(threads)),
        }
        ranks.append(subprocess.Popen([sys.executable, "-m", "facetrain", *argv], env=env))
    try:
        return _watch(ranks)
    except KeyboardInterrupt:
        _stop(ranks)
        return 130


def _watch(ranks: list[subprocess.Popen]) -> int:
    while True:
        codes = [p.poll() for p in ranks]
        failed = [(r, c) for r, c in enumerate(codes) if c not in (None, 0)]
        if failed:
            rank, code = failed[0]
            deadline = time.monotonic() + GRACE_SECONDS
            while any(p.poll() is None for p in ranks) and time.monotonic() < deadline:
                time.sleep(0.1)
            stopped = _stop(ranks)
            if code != 2:  # 2 is a user error the rank has already explained
                detail = f"; stopped ranks {stopped}" if stopped else ""
                print(f"error: rank {rank} exited with code {code}{detail}", file=sys.stderr)
            return code
        if all(c == 0 for c in codes):
            return 0
        time.sleep(0.2)


def _stop(ranks: list[subprocess.Popen]) -> list[int]:
    stopped = []
    for rank, process in enumerate(ranks):
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            stopped.append(rank)
    for process in ranks:
        try:
            process.wait(timeout=GRACE_SECONDS)
        except subprocess.TimeoutExpired:
            process.kill()
    return stopped
