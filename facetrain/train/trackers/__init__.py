"""Experiment trackers a run's figures also go to, besides `metrics.csv`: `train.trackers` names them.

Users keep their runs in a tracker they already have (TensorBoard, Weights & Biases, MLflow); each is
an optional package, imported only when chosen, so facetrain itself needs none of them. Each tracker
lives in its own file and registers its factory in TRACKERS (`base.py`); the factory takes the run
directory and returns a `Tracker`, or raises `TrackerMissing` when its package is not installed.
"""

from __future__ import annotations

import os
from importlib.util import find_spec
from pathlib import Path

from facetrain.files import write_failure_advice
from facetrain.logger import logger
from facetrain.train.trackers import mlflow_tracker, tensorboard_tracker, wandb_tracker  # noqa: F401  (they register)
from facetrain.train.trackers.base import TRACKERS, Tracker, TrackerMissing, missing

__all__ = ["TRACKERS", "Tracker", "TrackerMissing", "check_installed", "open_trackers", "tracker_failed"]


def check_installed(names: list[str]) -> None:
    """Before the run starts, on every rank alike: a chosen tracker whose package is missing stops it
    (a user who chose one would rather install it than lose the run's record there). TensorBoard, the
    default, is only said to be off when opened."""
    for name in names:
        if name != "tensorboard" and find_spec(TRACKERS.get(name).module) is None:
            raise missing(name)


def open_trackers(names: list[str], run_dir: Path) -> list[Tracker]:
    """The chosen trackers, opened on `run_dir`; a missing TensorBoard is said in one line and the run
    goes on without it, as it does without a tracker that cannot write (`tracker_failed`)."""
    trackers = []
    for name in names:
        try:
            trackers.append(TRACKERS.build(name, Path(run_dir)))
        except TrackerMissing as error:
            if name != "tensorboard":
                raise
            logger.info(f"note: TensorBoard logging is off: {error}")
        except OSError as error:
            logger.warning(tracker_failed(error, name, run_dir))
    if "tensorboard" not in names:
        logger.info(f"note: TensorBoard logging is off: train.trackers is {names} (add tensorboard)")
    return trackers


def tracker_failed(error: OSError, name: str, run_dir: Path) -> str:
    """The warning for tracker `name` that could not write (its folder read-only, a full disk): the run
    goes on without it rather than stop, its weights mattering more than one of its records."""
    where = os.fsdecode(error.filename or run_dir)  # TensorBoard names its event file in bytes
    return (
        f"warning: cannot write {where}: {error.strerror or error}; training goes on without {name} "
        f"(metrics.csv keeps every figure): {write_failure_advice(error)}, then resume to use it again"
    )
