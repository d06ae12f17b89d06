"""How the command line reports what a user can fix: one line, printed once over all ranks."""

from __future__ import annotations

import errno
import os

from facetrain.errors import EveryRankError, FacetrainError, PeerFailed
from facetrain.files import file_size_limit
from facetrain.logger import logger

# What the machine, not facetrain, refused: a full disk, a read-only or unwritable folder, a name the
# file system cannot hold. Any command can meet them on any file; each is a line naming the file.
ENVIRONMENT_ADVICE = {
    errno.ENOSPC: "free space, then run it again",
    errno.EDQUOT: "free space within your quota, then run it again",
    errno.EFBIG: "the file is larger than this process may write (ulimit -f) or the file system holds; raise the "
    "limit or choose another place",
    errno.EROFS: "choose a writable place",
    errno.EACCES: "check its permissions, or choose another place",
    errno.EPERM: "check its permissions, or choose another place",
    errno.ENAMETOOLONG: "choose a shorter name",
    errno.ELOOP: "fix or remove the symlink",
    errno.EIO: "the disk reported an error; check it",
    errno.EISDIR: "a folder stands where a file is written; move it or choose another place",
    errno.ENOTDIR: "a file stands where a folder of the path belongs; choose another place",
}


def environment_error_line(error: OSError) -> str | None:
    """One line for an OSError of ENVIRONMENT_ADVICE's kinds, or None for any other (a bug to show).
    "Free space" is advised only for a full disk: a file too big for this process's file-size limit
    (`ulimit -f`) is EFBIG too, and says so."""
    advice = ENVIRONMENT_ADVICE.get(error.errno)
    if advice is None:
        return None
    if error.errno == errno.EFBIG and (limit := file_size_limit()) is not None:
        advice = f"it passed this process's file-size limit of {limit} bytes (ulimit -f); raise it, then run it again"
    where = f"{error.filename}: " if error.filename else ""
    return f"{where}{error.strerror or os.strerror(error.errno)}; {advice}"


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
