"""`RUN/train.log`: what a training run told its user, kept beside its checkpoints.

On a cluster a run's output goes to a job file named by the scheduler, and a requeued or resized job
starts another one; users lose track of which file held which attempt. So every line rank 0 shows
(start-up notices, the head plan, progress lines, verification lines, the line that says why the run
stopped) and every rank's warning and error is appended to `train.log` in the run directory, each line
timestamped, each start of the run under a header that names what started it: a fresh start or a
resume, the scheduler's job id and restart count, the world size.

The log is a handler of facetrain's logger (`facetrain.logger`), so it gets exactly the lines the
console does, under the same rank rule, and the `LOG_ONLY` lines besides. Lines logged before the run
directory is known (device defaults, say) are held and written after the header. Writing the log never
stops training: a log that cannot be written (made read-only, a full disk) is said once on the console,
and its lines are kept again once it takes them.
"""

from __future__ import annotations

import logging
import os
import shlex
import socket
import sys
import time
import warnings
from pathlib import Path

from facetrain.files import append_to_record, write_failure_advice
from facetrain.job_env import job_id, restart_count
from facetrain.logger import RankFilter, logger, rank, rank_line

LOG_NAME = "train.log"
_MAX_HELD = 1000  # lines held before the run directory is known


def _stamp(line: str) -> str:
    return f"{time.strftime('%Y-%m-%d %H:%M:%S')} {line.rstrip()}\n"


_failing: set[Path] = set()  # logs whose last write failed, said once each


def _append(path: Path, lines: list[str]) -> None:
    error = append_to_record(path, lambda handle: handle.writelines(lines), _failing)
    if error is not None:  # the warning comes back here, and is not said again
        logger.warning(
            f"warning: cannot write {path}: {error.strerror or error}; training goes on, its lines on the "
            f"console only until you {write_failure_advice(error)}"
        )


class RunLogHandler(logging.Handler):
    """Appends each line to the run's log once `path` is set; before, holds rank 0's lines the coming
    run will own: its start-up lines and warnings, not an error (which ends the process's run) nor a
    Python warning (which may belong to anything before the run)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.path: Path | None = None
        self.held: list[str] = []
        self.addFilter(RankFilter())

    def emit(self, record: logging.LogRecord) -> None:
        line = _stamp(rank_line(record))
        if self.path is not None:
            _append(self.path, [line])
        elif len(self.held) < _MAX_HELD and _held_before_the_run(record):
            self.held.append(line)


def _held_before_the_run(record: logging.LogRecord) -> bool:
    shown_warning = record.levelno == logging.WARNING and getattr(record, "console", True)
    return rank() == "0" and (record.levelno < logging.WARNING or shown_warning)


_handler = RunLogHandler()
logger.addHandler(_handler)
_previous_showwarning = None


def append(run_dir: Path, line: str) -> None:
    """One line into a run's log after training returned (the line that says how to continue)."""
    _append(Path(run_dir) / LOG_NAME, [_stamp(line)])


def start_header(started: str, world_size: int) -> str:
    """The header of one start of a run: `started` says what (a fresh start, a resume from step N)."""
    words = [f"facetrain train: {started}", f"world size {world_size}", f"host {socket.gethostname()}"]
    if (slurm_job := job_id("SLURM_JOB_ID")) is not None:
        words.append(f"Slurm job {slurm_job} (restart {restart_count('SLURM_RESTART_COUNT')})")
    if restarts := restart_count("TORCHELASTIC_RESTART_COUNT"):
        words.append(f"torchrun restart {restarts}")
    words.append(f"pid {os.getpid()}")
    program = "facetrain" if Path(sys.argv[0]).name in ("__main__.py", "facetrain") else sys.argv[0]
    return f"=== {', '.join(words)}; command: {shlex.join([program, *sys.argv[1:]])}"


def attach(run_dir: Path, header: str) -> None:
    """From now on this process's lines go to `run_dir`'s log; rank 0 writes `header` and the lines
    held so far. A Python warning of any rank (torch's among them) becomes one facetrain warning line,
    on the console and in the log, the first time its text comes: torch's run over several lines, and
    a rank that repeats one at every step would bury the run's own lines."""
    global _previous_showwarning
    _handler.path = Path(run_dir) / LOG_NAME
    if rank() == "0":
        _append(_handler.path, [_stamp(header), *_handler.held])
    _handler.held.clear()
    if _previous_showwarning is None:
        _previous_showwarning = warnings.showwarning
        said: set[str] = set()

        def showwarning(message, category, filename, lineno, file=None, line=None):
            text = f"warning: {category.__name__}: {' '.join(str(message).split())}"
            if text not in said:
                said.add(text)
                logger.warning(text)

        warnings.showwarning = showwarning


def detach() -> None:
    """The run has ended in this process: its lines are no longer the run's."""
    global _previous_showwarning
    _handler.path = None
    _handler.held.clear()
    if _previous_showwarning is not None:
        warnings.showwarning, _previous_showwarning = _previous_showwarning, None
