"""Aligning a tree of images into the same tree of crops, in several processes.

The detector and landmark predictor are built once in the main process, which also proves dlib and
its models are there before any work starts; forked worker processes inherit them, and processes
started by spawning build their own (dlib objects cannot be pickled). Workers write their crops
themselves, so only short outcome records travel back.
Every target is checked before any work starts, so an existing file is never replaced without
`overwrite`, and each crop is written atomically.
"""

from __future__ import annotations

import multiprocessing
import os
from pathlib import Path
from typing import NamedTuple

import cv2
import numpy as np

from facetrain.align.aligner import DEFAULT_DETECTOR, DEFAULT_SIZE, DEFAULT_TEMPLATE, FaceAligner
from facetrain.align.report import (
    ALIGNED,
    CENTERED,
    NO_FACE,
    REPORT_NAME,
    UNREADABLE,
    AlignSummary,
    ImageOutcome,
    summarize,
    write_report,
)
from facetrain.align.transform import center_crop
from facetrain.data.decode import IMAGE_EXTENSIONS, BadImageError, decode_image, left_out_warnings
from facetrain.errors import FacetrainError
from facetrain.files import atomic_target, refuse_to_overwrite
from facetrain.logger import logger
from facetrain.progress import ProgressBar
from facetrain.registry import Registry

KEPT_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".webp")
CONVERTED_EXTENSION = ".png"
CHUNK_SIZE = 8

NO_FACE_ACTIONS: Registry[ImageOutcome] = Registry("--fallback")
_worker_state: _Worker | None = None


class Task(NamedTuple):
    source: Path
    target: Path
    relative: str


class AlignSettings(NamedTuple):
    """How each image is aligned: the crop size (None: the template's own), the face detector, what to do
    with an image without a face (`NO_FACE_ACTIONS`) and the landmark template. A worker process is
    built from these alone."""

    size: tuple[int, int] | None = DEFAULT_SIZE
    detector: str = DEFAULT_DETECTOR
    fallback: str = "skip"
    template: str = DEFAULT_TEMPLATE


@NO_FACE_ACTIONS.register("skip")
def _skip(worker: _Worker, task: Task, image: np.ndarray) -> ImageOutcome:
    return ImageOutcome(task.relative, NO_FACE, 0, "", "no face found")


@NO_FACE_ACTIONS.register("center")
def _centre(worker: _Worker, task: Task, image: np.ndarray) -> ImageOutcome:
    worker.write(task.target, center_crop(image, worker.aligner.size))
    return ImageOutcome(task.relative, CENTERED, 0, str(task.target), "no face found; centre-cropped")


class _Worker:
    """The per-process aligner and what to do with faceless images."""

    def __init__(self, settings: AlignSettings):
        self.settings = settings
        self.aligner = FaceAligner(settings.size, settings.detector, settings.template)
        self.on_no_face = NO_FACE_ACTIONS.get(settings.fallback)

    def run(self, task: Task) -> ImageOutcome:
        try:
            image = decode_image(task.source)
        except BadImageError as error:
            return ImageOutcome(task.relative, UNREADABLE, 0, "", str(error))
        aligned = self.aligner.align(image)
        if aligned is None:
            return self.on_no_face(self, task, image)
        self.write(task.target, aligned.crop)
        return ImageOutcome(task.relative, ALIGNED, aligned.faces, str(task.target), "")

    @staticmethod
    def write(target: Path, rgb: np.ndarray) -> None:
        target.parent.mkdir(parents=True, exist_ok=True)
        with atomic_target(target) as tmp:
            if not cv2.imwrite(str(tmp), cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR)):
                raise FacetrainError(f"cannot write {target}; check that the disk has room and is writable")


def _start_worker(*settings) -> None:
    """Builds the worker in a spawned process; a forked one already holds the parent's."""
    global _worker_state
    if _worker_state is None or _worker_state.settings != AlignSettings(*settings):
        _worker_state = _Worker(AlignSettings(*settings))


def _run_in_worker(task: Task) -> ImageOutcome:
    assert _worker_state is not None, "the pool initializer builds the worker"
    return _worker_state.run(task)


def plan_tasks(source: Path, destination: Path) -> list[Task]:
    """Every image under `source` (hidden files left out) and the crop it becomes under `destination`.

    Crops keep their name; formats that cannot hold a colour crop losslessly enough (PGM, PPM) are
    written as PNG.
    """
    if not source.is_dir():
        raise FacetrainError(f"SRC {source} is not a folder; pass a folder of images or of identity folders")
    if destination.exists() and not destination.is_dir():
        raise FacetrainError(f"DST {destination} is a file, not a folder; choose a folder for the crops")
    source_abs, destination_abs = source.resolve(), destination.resolve()
    if destination_abs == source_abs or source_abs in destination_abs.parents:
        raise FacetrainError(f"DST {destination} is inside SRC {source}; choose a destination outside it")
    tasks = []
    for folder, folders, files in os.walk(source):
        folders[:] = sorted(name for name in folders if not name.startswith("."))
        for name in sorted(files):
            if name.startswith(".") or not name.lower().endswith(IMAGE_EXTENSIONS):
                continue
            relative = Path(folder, name).relative_to(source)
            target = destination / relative
            if target.suffix.lower() not in KEPT_EXTENSIONS:
                target = target.with_suffix(CONVERTED_EXTENSION)
            tasks.append(Task(source / relative, target, relative.as_posix()))
    if not tasks:
        raise FacetrainError(f"SRC {source} holds no images ({', '.join(IMAGE_EXTENSIONS)})")
    return tasks


def align_folder(
    source: str | Path,
    destination: str | Path,
    settings: AlignSettings = AlignSettings(),
    workers: int = 1,
    overwrite: bool = False,
    progress: bool = True,
    report: str | Path | None = None,
) -> AlignSummary:
    """Align every image under `source` into the same tree under `destination` and write the report.

    Images without a face are skipped (`fallback="skip"`) or centre-cropped (`"center"`); both are
    listed in the report CSV (default `destination/align_report.csv`), as are unreadable images
    (corrupt, not images, over the pixel limit), which are also named on stderr.
    """
    source, destination = Path(source), Path(destination)
    report_path = Path(report) if report is not None else destination / REPORT_NAME
    NO_FACE_ACTIONS.get(settings.fallback)  # a bad name fails before SRC is listed
    tasks = plan_tasks(source, destination)
    targets = [task.target for task in tasks]
    if len(set(targets)) != len(targets):
        raise FacetrainError(
            f"SRC {source} has images that would become the same crop (e.g. x.pgm and x.png); rename one"
        )
    if not overwrite:
        refuse_to_overwrite([*targets, report_path])
    worker = _Worker(settings)
    outcomes: list[ImageOutcome] = []
    not_aligned = 0
    with ProgressBar(total=len(tasks), desc="align", unit="img", disable=not progress) as bar:
        for outcome in _outcomes(worker, tasks, workers):
            outcomes.append(outcome)
            bar.update(1)
            if outcome.status != ALIGNED:
                not_aligned += 1
                bar.set_postfix_str(f"{not_aligned} not aligned")
    unreadable = sorted(outcome for outcome in outcomes if outcome.status == UNREADABLE)
    for line in left_out_warnings([outcome.message for outcome in unreadable]):
        logger.warning(line)
    report_path.parent.mkdir(parents=True, exist_ok=True)
    write_report(outcomes, report_path)
    return summarize(outcomes, destination, report_path)


def _outcomes(worker: _Worker, tasks: list[Task], workers: int):
    global _worker_state
    if workers <= 1:
        yield from map(worker.run, tasks)
        return
    _worker_state = worker
    try:
        with multiprocessing.Pool(
            min(workers, len(tasks)), initializer=_start_worker, initargs=worker.settings
        ) as pool:
            yield from pool.imap_unordered(_run_in_worker, tasks, chunksize=CHUNK_SIZE)
    finally:
        _worker_state = None
