"""`logger`: the one channel for what facetrain tells its user while it works, on every rank.

    from facetrain.logger import logger
    logger.info("resumed from runs/x/checkpoints/step_00000040 at step 40")
    logger.warning("warning: ...")

Each process configures it once, when this module is first imported; every rank of a run then follows
one rule. Rank 0 shows its info lines (every rank computes them alike, so the others would only repeat
them); every rank shows its warnings and errors, those of a rank other than 0 prefixed with `[rank N]`
(the `RANK` that torch's launchers set, read when the line is written). A line's text is the message
itself: facetrain's messages say "warning:" or "error:" where they mean it.

Info lines go to stdout; warnings and errors to stderr, so that a command's result on stdout stays
clean, except in a training run (`warnings_beside_info`), whose output is one record in time order:
its warnings stay on stdout beside its info lines. Each stream is looked up as the line is written (so a
test's captured stream gets it). A progress bar draws on stderr and redraws in place: a line written
under it would be overwritten, or break it in two. `progress` installs a writer (`set_console_writer`)
that clears the bars, writes the line and redraws them. The run's `train.log` is another handler on
the same logger (`run_log`); a record logged with `extra=LOG_ONLY` goes to it and to no console, for
lines the user already sees another way (a progress bar's own line).
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager

NAME = "facetrain"
# `logger.info(line, extra=LOG_ONLY)`: into the run's log, not onto the console
LOG_ONLY = {"console": False}

logger = logging.getLogger(NAME)


def rank() -> str:
    """This process's rank in a run, "0" outside one."""
    return os.environ.get("RANK", "0")


class RankFilter(logging.Filter):
    """Rank 0 passes every line, the other ranks only their warnings and errors."""

    def filter(self, record: logging.LogRecord) -> bool:
        return rank() == "0" or record.levelno >= logging.WARNING


def rank_line(record: logging.LogRecord) -> str:
    """The record's message, named by its rank when that is not rank 0."""
    this_rank = rank()
    return record.getMessage() if this_rank == "0" else f"[rank {this_rank}] {record.getMessage()}"


def _is_terminal(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # no such method, or a closed stream
        return False


def _plain_write(line: str, stream) -> None:
    print(line, file=stream)


class ConsoleHandler(logging.Handler):
    """Info lines to stdout, errors to stderr, warnings to stderr or beside the info lines, through
    `write` (one that spares progress bars once `progress` is imported)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.write: Callable[[str, object], None] = _plain_write
        self.warnings_on_stdout = False
        self.addFilter(RankFilter())

    def filter(self, record: logging.LogRecord) -> bool:
        return getattr(record, "console", True) and super().filter(record)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            on_stdout = record.levelno < logging.WARNING or (
                record.levelno == logging.WARNING and self.warnings_on_stdout
            )
            stream = sys.stdout if on_stdout else sys.stderr
            line = rank_line(record)
            if rank() != "0" and _is_terminal(stream):
                line = "\n" + line  # rank 0's progress bar on the same terminal may be mid-line
            self.write(line, stream)
            if record.levelno >= logging.WARNING:
                stream.flush()  # a warning or error shows at once, before what follows it on stdout
        except Exception:
            self.handleError(record)


console = ConsoleHandler()


def set_console_writer(write: Callable[[str, object], None]) -> None:
    """`write(line, stream)` writes the console's lines from now on (`progress`: around the bars)."""
    console.write = write


@contextmanager
def warnings_beside_info() -> Iterator[None]:
    """Within it this process runs training: its warnings go to stdout with its info lines, in time
    order (a cluster's job file holds the run's whole story; the progress bar and errors stay on
    stderr)."""
    before, console.warnings_on_stdout = console.warnings_on_stdout, True
    try:
        yield
    finally:
        console.warnings_on_stdout = before


def _configure() -> None:
    """Once per process: the handler, the level, and no second copy of each line through the root
    logger's handlers (pytest's, a user's `logging.basicConfig`)."""
    if console not in logger.handlers:
        logger.addHandler(console)
    logger.setLevel(logging.INFO)
    logger.propagate = False


_configure()
