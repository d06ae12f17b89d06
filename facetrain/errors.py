"""Errors a user can cause and fix.

The CLI prints these as a single line with no traceback, so the message itself must name the file,
key or line at fault and say what to do.
"""

# control characters a name can carry (a folder named "a\nb") shown escaped, so a message stays one line
_ESCAPED = {code: repr(chr(code))[1:-1] for code in (*range(32), 127)}


class FacetrainError(Exception):
    """A user-fixable problem (bad config, bad path, bad file, bad setting). Its message is one line
    whatever it quotes: a newline or other control character in a file name is written escaped."""

    def __init__(self, *args: object):
        super().__init__(*(arg.translate(_ESCAPED) if isinstance(arg, str) else arg for arg in args))


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
