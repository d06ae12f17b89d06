"""What a run directory may hold before training writes into it, and who may write there.

Training never writes over what it did not make: a directory with checkpoints is continued only with
`--resume`, a `config.yaml` there that facetrain did not write (a user's own config, say) is never
replaced, and a folder that holds anything but a facetrain run is refused outright. A run is marked
by `RUN_MARKER`, written when facetrain creates the directory; runs from before the marker are known
by facetrain's own files (its config header, checkpoints, metrics log). facetrain marks its resolved
config with a first line of its own, `RUN_CONFIG_HEADER`, and replaces only a file that starts with it.

Whatever writes into a run directory holds its lock (`facetrain.run_lock`) meanwhile: rank 0 of a
training run for the run's whole life, an eval report or an export while it writes.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import yaml

from facetrain.checkpoint.layout import holds_checkpoints
from facetrain.checkpoint.resume_point import refuse_training_over, restarted_job
from facetrain.config import to_dict
from facetrain.errors import EveryRankError, FacetrainError
from facetrain.files import (
    atomic_write_text,
    links_leaving,
    open_appending,
    output_path_problem,
    write_failure_advice,
)
from facetrain.run_lock import LOCK_NAME, acquire, holds, release

RUN_CONFIG = "config.yaml"
RUN_CONFIG_HEADER = "# facetrain train: this run's resolved config, rewritten at each start; edit a copy\n"
RUN_MARKER = ".facetrain-run"
METRICS_COLUMNS = ["step", "epoch", "loss", "accuracy", "lr", "images_per_s", "elapsed_s"]
"""metrics.csv's header (`facetrain.train.metrics` writes it): one of the files that mark a run."""
APPENDED_FILES = ("train.log", "metrics.csv")
"""What a resumed run appends to; the files it replaces whole are written beside and renamed over."""
RUN_FILES = (*APPENDED_FILES, "classes.json", "summary.json", "curves.png", RUN_CONFIG, RUN_MARKER, LOCK_NAME)
RUN_FOLDERS = ("checkpoints", "eval", "tensorboard")
BUSY_ADVICE = "wait for it to finish or stop it, or choose another train.output_dir"


def is_run_dir(path: Path) -> bool:
    """Whether `path` is a facetrain run directory: marked, or holding facetrain's own run files."""
    if not path.is_dir():
        return False
    if (path / RUN_MARKER).is_file() or (path / LOCK_NAME).is_file() or holds_checkpoints(path):
        return True
    return _first_line(path / RUN_CONFIG) == RUN_CONFIG_HEADER or _first_line(path / "metrics.csv") == (
        ",".join(METRICS_COLUMNS) + "\n"
    )


def _first_line(path: Path) -> str | None:
    try:
        with path.open() as handle:
            return handle.readline()
    except (OSError, UnicodeDecodeError):
        return None


def check_run_dir(run_dir: Path) -> None:
    """Refuse a run directory whose `config.yaml` is someone else's file, and a folder that is
    neither empty nor a facetrain run."""
    problem = output_path_problem(run_dir, "train.output_dir")
    if problem is not None:
        raise EveryRankError(problem)
    if is_run_dir(run_dir):
        check_run_files(run_dir)
    path = run_dir / RUN_CONFIG
    if path.is_file():
        try:
            with path.open() as handle:
                first_line = handle.readline()
        except OSError as error:
            raise EveryRankError(f"cannot read {path}: {error.strerror}") from None
        if first_line != RUN_CONFIG_HEADER:
            raise EveryRankError(
                f"{path} was not written by facetrain and training would replace it; move it out of "
                "train.output_dir, or choose another train.output_dir"
            )
    if run_dir.is_dir() and not is_run_dir(run_dir) and (entries := sorted(run_dir.iterdir())):
        raise EveryRankError(
            f"train.output_dir {run_dir} is not a facetrain run and holds files of its own (first: "
            f"{entries[0]}); training would write among them: choose a new or empty folder"
        )


def check_run_files(run_dir: Path) -> None:
    """Refuse a run whose files lead out of it or are of the wrong kind. A run copied with its links,
    or a link planted in it (`ln -s ~/thesis.txt RUN/classes.json`), would have training write through
    the link into a file outside the run; a folder where the run keeps a file (or the reverse) was a
    traceback at the first write."""
    for link, target in links_leaving(run_dir):
        raise EveryRankError(
            f"{link} is a symlink to {target}, outside the run folder {run_dir}, and training writes only "
            "inside its run: replace the link with a copy of what it names, or remove it"
        )
    for name in RUN_FILES:
        if (run_dir / name).is_dir():
            raise EveryRankError(
                f"{run_dir / name} is a folder where the run keeps a file of its own; move it out of the run"
            )
    for name in RUN_FOLDERS:
        if (run_dir / name).exists() and not (run_dir / name).is_dir():
            raise EveryRankError(
                f"{run_dir / name} is a file where the run keeps a folder of its own; move it out of the run"
            )


def claim_run_dir(run_dir: Path) -> None:
    """Rank 0, before anything else is written: refuse a folder that is not a run, create and mark
    the run directory, and take its lock until `facetrain.run_lock.release` (at the trainer's end) or
    this process's end, whichever comes first."""
    check_run_dir(run_dir)
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        acquire(run_dir, "facetrain train", BUSY_ADVICE)
        for name in APPENDED_FILES:  # what the run appends to from now on must take it (read-only?)
            if (run_dir / name).exists():
                open_appending(run_dir / name).close()
        marker = run_dir / RUN_MARKER
        if not marker.exists():
            created = {"created_by": "facetrain train", "created": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
            atomic_write_text(marker, json.dumps(created) + "\n")
    except OSError as error:
        release(run_dir)
        if error.filename is not None and Path(error.filename) in [run_dir / n for n in APPENDED_FILES]:
            raise FacetrainError(
                f"cannot append to {error.filename}: {error.strerror or error}; the run adds its record "
                f"there from now on: {write_failure_advice(error)}, then run it again"
            ) from None
        raise _unwritable(run_dir, error) from None


def check_run_dir_free(run_dir: Path, resume: str | None) -> None:
    """Before a launcher starts its ranks: refuse at once a new run over checkpoints, or a run another
    process holds."""
    refuse_training_over(run_dir, resume, restarted_job(run_dir))
    if is_run_dir(run_dir):
        try:
            acquire(run_dir, "facetrain train", BUSY_ADVICE)
        except OSError as error:
            raise _unwritable(run_dir, error) from None
        release(run_dir)


@contextmanager
def writing_into_run(path: Path, command: str, advice: str) -> Iterator[None]:
    """Hold the lock of the run directory `path` lies in, if any, while writing there.

    Where the lock file cannot be created (a read-only run), nobody can write there either: the write
    itself then fails with its own message.
    """
    path = Path(os.path.abspath(path))
    run = next((candidate for candidate in (path, *path.parents) if is_run_dir(candidate)), None)
    locked = False
    if run is not None and not holds(run):
        with suppress(OSError):
            acquire(run, command, advice)
            locked = True
    try:
        yield
    finally:
        if locked:
            release(run)


def _unwritable(run_dir: Path, error: OSError) -> FacetrainError:
    return FacetrainError(
        f"cannot write to train.output_dir {run_dir}: {error.strerror} ({error.filename}); "
        "choose a writable folder with free space"
    )


def write_run_config(cfg: Any, run_dir: Path) -> None:
    """The resolved config beside the run's checkpoints; a full disk or read-only folder is one line."""
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        atomic_write_text(
            run_dir / RUN_CONFIG, RUN_CONFIG_HEADER + yaml.safe_dump(to_dict(cfg), sort_keys=False)
        )
    except OSError as error:
        raise _unwritable(run_dir, error) from None
