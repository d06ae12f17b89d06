"""Errors a user can cause and fix.

The CLI prints these as a single line with no traceback, so the message itself must name the file,
key or line at fault and say what to do.
"""


class FacetrainError(Exception):
    """A user-fixable problem (bad config, bad path, bad file, bad setting)."""


class PeerFailed(FacetrainError):
    """Raised on the other ranks when one rank hit a user error; that rank already printed it."""


class EveryRankError(FacetrainError):
    """A user error that every rank detects identically (from shared settings or gathered inputs).

    Only rank 0 prints it, so N ranks do not repeat the same line N times.
    """
