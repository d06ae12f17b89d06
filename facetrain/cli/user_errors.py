"""How the command line reports what a user can fix: one line, printed once over all ranks."""

from __future__ import annotations

import os

from facetrain.errors import EveryRankError, FacetrainError, PeerFailed
from facetrain.files import WRITE_FAILURE_ADVICE, write_failure_advice
from facetrain.logger import logger


def environment_error_line(error: OSError) -> str | None:
    """One line for an OSError the machine caused (`files.WRITE_FAILURE_ADVICE`'s kinds), or None for any
    other (a bug to show)."""
    if error.errno not in WRITE_FAILURE_ADVICE:
        return None
    where = f"{error.filename}: " if error.filename else ""
    return f"{where}{error.strerror or os.strerror(error.errno)}; {write_failure_advice(error)}, then run it again"


def report_user_error(error: FacetrainError) -> int:
    """Report a user error as one line; return the exit code 2.

    Printed once for errors every rank sees alike, never for a rank that only stopped because another
    failed, and not at all by ranks of a `--nproc` run, whose launcher prints the first cause last.
    Each rank also records it for the launcher or torchrun (`facetrain.parallel.launch.record_user_error`).
    """
    rank = os.environ.get("RANK", "0")
    if "TORCHELASTIC_ERROR_FILE" in os.environ:
        from facetrain.parallel.launch import launched_locally, record_user_error

        record_user_error(error)
        if launched_locally():
            return 2
    if isinstance(error, PeerFailed) or (rank != "0" and isinstance(error, EveryRankError)):
        return 2  # the rank that failed, or rank 0, prints it
    logger.error(f"error: {error}")  # named by its rank when not rank 0's
    return 2
