"""Errors a user can cause and fix.

The CLI prints these as a single line with no traceback, so the message itself must name the file,
key or line at fault and say what to do.
"""


class FacetrainError(Exception):
    """A user-fixable problem (bad config, bad path, bad file, bad setting)."""


class PeerFailed(FacetrainError):
    """Raised on the other ranks when one rank hit a user error; that rank already printed it."""


class PeerLost(FacetrainError):
    """A collective failed because another rank died or stopped answering; the message names it.

    A bystander's view: when the lost rank reported its own error, that one is the cause to show."""


class EveryRankError(FacetrainError):
    """A user error that every rank detects identically (from shared settings or gathered inputs).

    Only rank 0 prints it, so N ranks do not repeat the same line N times.
    """


class CollectiveError(FacetrainError):
    """A collective (or joining the group) failed on this rank for a reason of its own: a network
    interface, InfiniBand, a GPU shared by two ranks, a driver. The message keeps the backend's key line,
    so the real cause is not hidden behind a lost-rank report."""
