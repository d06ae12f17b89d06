"""What the stop tools (signal_matrix.py, stop_timing.py) read of a running `facetrain train` from
outside: its process tree, whether a process still lives, and the last step its metrics.csv logged."""

from __future__ import annotations

from pathlib import Path


def tree(pid: int) -> list[int]:
    """`pid` and every process below it (ranks, their loader workers), through /proc."""
    found, stack = [pid], [pid]
    while stack:
        parent = stack.pop()
        try:
            children = [int(c) for c in Path(f"/proc/{parent}/task/{parent}/children").read_text().split()]
        except OSError:
            continue
        found += children
        stack += children
    return found


def alive(pid: int) -> bool:
    """Whether `pid` runs (an exited child not yet reaped by its parent does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def logged_step(run: Path) -> int:
    """The last step in the run's metrics.csv (0 before the first, or while a row is being written)."""
    try:
        lines = (run / "metrics.csv").read_text().splitlines()
        return int(lines[-1].split(",")[0]) if len(lines) > 1 else 0
    except (OSError, ValueError, IndexError):
        return 0
