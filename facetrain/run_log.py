"""`RUN/train.log`: what a training run told its user, kept beside its checkpoints.

On a cluster a run's output goes to a job file named by the scheduler, and a requeued or resized job
starts another one; users lose track of which file held which attempt. So every line rank 0 shows
(start-up notices, the head plan, progress lines, verification lines, the line that says why the run
stopped) and every rank's warning and error is appended to `train.log` in the run directory, each line
timestamped, each start of the run under a header that names what started it: a fresh start or a
resume, the scheduler's job id and restart count, the world size.

Lines printed before the run directory is known (device defaults, say) are held and written after the
header. Writing the log never stops training: a log that cannot be written is skipped.
"""

from __future__ import annotations

import os
import shlex
import socket
import sys
import time
import warnings
from pathlib import Path

LOG_NAME = "train.log"
_MAX_HELD = 1000  # lines held before the run directory is known

_path: Path | None = None
_held: list[str] = []
_previous_showwarning = None


def _rank() -> str:
    return os.environ.get("RANK", "0")


def _stamp(line: str) -> str:
    return f"{time.strftime('%Y-%m-%d %H:%M:%S')} {line.rstrip()}\n"


def _append(path: Path, lines: list[str]) -> None:
    try:
        with path.open("a") as handle:
            handle.writelines(lines)
    except OSError:
        pass


def note(line: str) -> None:
    """A line rank 0 shows its user (other ranks' lines are not kept: they repeat rank 0's)."""
    if _rank() != "0":
        return
    if _path is not None:
        _append(_path, [_stamp(line)])
    elif len(_held) < _MAX_HELD:
        _held.append(_stamp(line))


def problem(line: str) -> None:
    """A warning or an error of any rank, named by its rank."""
    if _path is not None:
        _append(_path, [_stamp(line if _rank() == "0" else f"[rank {_rank()}] {line}")])


def append(run_dir: Path, line: str) -> None:
    """One line into a run's log after training returned (the line that says how to continue)."""
    _append(Path(run_dir) / LOG_NAME, [_stamp(line)])


def start_header(started: str, world_size: int) -> str:
    """The header of one start of a run: `started` says what (a fresh start, a resume from step N)."""
    words = [f"facetrain train: {started}", f"world size {world_size}", f"host {socket.gethostname()}"]
    if "SLURM_JOB_ID" in os.environ:
        restarts = os.environ.get("SLURM_RESTART_COUNT") or "0"
        words.append(f"Slurm job {os.environ['SLURM_JOB_ID']} (restart {restarts})")
    if int(os.environ.get("TORCHELASTIC_RESTART_COUNT") or 0):
        words.append(f"torchrun restart {os.environ['TORCHELASTIC_RESTART_COUNT']}")
    words.append(f"pid {os.getpid()}")
    program = "facetrain" if Path(sys.argv[0]).name in ("__main__.py", "facetrain") else sys.argv[0]
    return f"=== {', '.join(words)}; command: {shlex.join([program, *sys.argv[1:]])}"


def attach(run_dir: Path, header: str) -> None:
    """From now on this process's lines go to `run_dir`'s log; rank 0 writes `header` and the lines
    held so far. Python warnings of any rank go there too."""
    global _path, _previous_showwarning
    _path = Path(run_dir) / LOG_NAME
    if _rank() == "0":
        _append(_path, [_stamp(header), *_held])
    _held.clear()
    if _previous_showwarning is None:
        _previous_showwarning = warnings.showwarning

        def showwarning(message, category, filename, lineno, file=None, line=None):
            problem(f"warning: {category.__name__}: {message}")
            _previous_showwarning(message, category, filename, lineno, file, line)

        warnings.showwarning = showwarning


def detach() -> None:
    """The run has ended in this process: its lines are no longer the run's."""
    global _path, _previous_showwarning
    _path = None
    _held.clear()
    if _previous_showwarning is not None:
        warnings.showwarning, _previous_showwarning = _previous_showwarning, None
