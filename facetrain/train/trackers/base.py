"""The interface every tracker keeps, and the registry `train.trackers` names them from.

Apart from the package's `__init__` so each tracker's file can register itself here without importing
the package that imports it.
"""

from __future__ import annotations

from typing import Protocol

from facetrain.errors import FacetrainError
from facetrain.registry import Registry


class Tracker(Protocol):
    """Where rank 0 sends the run's config once and its figures as it trains."""

    module: str  # the module it imports, also its name in train.trackers

    def log_config(self, config: dict) -> None: ...

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None: ...

    def close(self) -> None: ...


class TrackerMissing(FacetrainError):
    """A chosen tracker's package is not installed; the message is the one line to show."""


def missing(name: str) -> TrackerMissing:
    tracker = TRACKERS.get(name)
    return TrackerMissing(
        f"train.trackers lists {name}, which needs {tracker.package}: "
        f"pip install 'facetrain[{tracker.extra}]' (or pip install {tracker.package})"
    )


TRACKERS: Registry = Registry("tracker")
