"""The IJB-B / IJB-C 1:1 verification files, laid out as insightface's eval_ijbc.py reads them.

    DIR/meta/ijbc_face_tid_mid.txt          IMAGE TEMPLATE_ID MEDIA_ID          a line per face image
    DIR/meta/ijbc_name_5pts_score.txt       IMAGE X1 Y1 ... X5 Y5 DETECTOR_SCORE the same images, in order
    DIR/meta/ijbc_template_pair_label.txt   TEMPLATE_1 TEMPLATE_2 LABEL         1: the same person
    DIR/loose_crop/IMAGE                    the loosely cropped face photos

(`ijbb_...` for IJB-B.) insightface pairs the two image lists by line number alone; here their names
must agree line by line, every template of a pair must have faces and every photo must exist, all
checked before a single face is embedded, each problem one line naming the file and line. IJB-C's
15.7 million pairs are read with pandas' C parser; a file it cannot read is scanned again in Python
for the line at fault.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from facetrain.errors import FacetrainError

IJB_TARGETS = ("IJBB", "IJBC")
CROPS_FOLDER = "loose_crop"
MISSING_SHOWN = 3
MAX_LANDMARK = 1e5
"""Pixels; the loose crops are a few hundred wide."""


@dataclass(frozen=True)
class IjbMeta:
    """The protocol of one target: per face image its path, five landmarks (x, y), detector score,
    template and media; per template pair its two template ids and label."""

    target: str
    root: Path
    image_paths: list[str]
    landmarks: np.ndarray  # (N, 5, 2) float32
    detector_scores: np.ndarray  # (N,) float32
    templates: np.ndarray  # (N,) int64
    medias: np.ndarray  # (N,) int64
    pair_templates: np.ndarray  # (P, 2) int64
    labels: np.ndarray  # (P,) bool

    @property
    def num_templates(self) -> int:
        return len(np.unique(self.templates))


def meta_paths(root: Path, target: str) -> dict[str, Path]:
    prefix = target.lower()
    meta = Path(root) / "meta"
    return {
        "faces": meta / f"{prefix}_face_tid_mid.txt",
        "landmarks": meta / f"{prefix}_name_5pts_score.txt",
        "pairs": meta / f"{prefix}_template_pair_label.txt",
    }


def read_ijb_meta(root: str | Path, target: str = "IJBC") -> IjbMeta:
    """Read and cross-check the three meta files of `target` (IJBB or IJBC) under `root`."""
    root = Path(root)
    if target not in IJB_TARGETS:
        raise FacetrainError(f"IJB target {target!r}: use one of {', '.join(IJB_TARGETS)}")
    if not root.is_dir():
        raise FacetrainError(
            f"IJB folder {root} does not exist; give the folder holding meta/ and {CROPS_FOLDER}/"
        )
    paths = meta_paths(root, target)
    for path in paths.values():
        if not path.is_file():
            raise FacetrainError(
                f"{path} does not exist; --ijb takes the folder with meta/ and {CROPS_FOLDER}/ of insightface's "
                f"IJB release, and --ijb-target {target} reads meta/{target.lower()}_*.txt"
            )
    faces = _read_table(paths["faces"], [str, int, int], "IMAGE TEMPLATE_ID MEDIA_ID")
    points = _read_table(paths["landmarks"], [str, *[float] * 10, float], "IMAGE X1 Y1 ... X5 Y5 SCORE")
    pairs = _read_table(paths["pairs"], [int, int, int], "TEMPLATE_1 TEMPLATE_2 LABEL")
    names = faces[0].to_numpy(dtype=str)
    _check_same_images(paths, names, points[0].to_numpy(dtype=str))
    _check_names_inside(paths["faces"], names)
    landmarks = points[list(range(1, 11))].to_numpy(dtype=np.float64)
    _check_landmarks(paths["landmarks"], landmarks.reshape(-1, 5, 2))
    templates = faces[1].to_numpy(dtype=np.int64)
    labels = pairs[2].to_numpy(dtype=np.int64)
    pair_templates = pairs[[0, 1]].to_numpy(dtype=np.int64)
    _check_labels(paths["pairs"], labels)
    _check_pair_templates(paths, pair_templates, templates)
    image_paths = [str(root / CROPS_FOLDER / name) for name in names]
    _check_images_exist(root, image_paths)
    return IjbMeta(
        target=target,
        root=root,
        image_paths=image_paths,
        landmarks=landmarks.astype(np.float32).reshape(-1, 5, 2),
        detector_scores=points[11].to_numpy(dtype=np.float32),
        templates=templates,
        medias=faces[2].to_numpy(dtype=np.int64),
        pair_templates=pair_templates,
        labels=labels == 1,
    )


def _read_table(path: Path, kinds: list[type], layout: str) -> pd.DataFrame:
    """The space-separated columns of `path`, each of its kind; the first bad line is named."""
    try:
        table = pd.read_csv(path, sep=r"\s+", header=None, dtype={0: str} if kinds[0] is str else None)
    except pd.errors.EmptyDataError:
        raise FacetrainError(f"{path} is empty; expected lines of {layout}") from None
    except (pd.errors.ParserError, UnicodeDecodeError, ValueError):
        raise FacetrainError(_first_bad_line(path, kinds, layout)) from None
    if table.shape[1] != len(kinds) or table.isna().to_numpy().any():
        raise FacetrainError(_first_bad_line(path, kinds, layout))
    for column, kind in enumerate(kinds):
        if kind is not str and not pd.api.types.is_numeric_dtype(table[column]):
            raise FacetrainError(_first_bad_line(path, kinds, layout))
        if kind is int and not pd.api.types.is_integer_dtype(table[column]):
            raise FacetrainError(_first_bad_line(path, kinds, layout))
    return table


def _first_bad_line(path: Path, kinds: list[type], layout: str) -> str:
    try:
        with path.open(encoding="utf-8") as file:
            for number, line in enumerate(file, start=1):
                fields = line.split()
                if len(fields) != len(kinds) or not all(_parses(f, kind) for f, kind in zip(fields, kinds)):
                    return f"{path} line {number}: expected {layout} ({len(kinds)} fields), got {line.strip()[:80]!r}"
    except UnicodeDecodeError:
        return f"{path}: not a text file; expected lines of {layout}"
    return f"{path}: expected lines of {layout} separated by spaces"


def _parses(field: str, kind: type) -> bool:
    try:
        kind(field)
    except ValueError:
        return False
    return True


def _check_same_images(paths: dict[str, Path], faces: np.ndarray, points: np.ndarray) -> None:
    if len(faces) != len(points):
        raise FacetrainError(
            f"{paths['landmarks']} has {len(points)} lines, {paths['faces']} {len(faces)}; they list the same "
            "face images in the same order"
        )
    differ = np.flatnonzero(faces != points)
    if len(differ):
        line = int(differ[0]) + 1
        raise FacetrainError(
            f"{paths['landmarks']} line {line} names {str(points[differ[0]])[:80]!r} where {paths['faces'].name} "
            f"line {line} names {str(faces[differ[0]])[:80]!r}; the two files list the same face images in the same order"
        )


def _check_names_inside(path: Path, names: np.ndarray) -> None:
    """Every IMAGE a plain relative name under loose_crop/: an absolute one, a `..` part or a NUL byte
    would have a protocol file open any file on the machine."""
    series = pd.Series(names)
    outside = series.str.startswith("/") | series.str.contains(r"(?:^|/)\.\.(?:/|$)|\x00", regex=True)
    if outside.any():
        line = int(np.flatnonzero(outside.to_numpy())[0])
        raise FacetrainError(
            f"{path} line {line + 1}: IMAGE {names[line][:80]!r} leads outside {CROPS_FOLDER}/; images are named "
            f"relative to it, without '..'"
        )


def _check_landmarks(path: Path, landmarks: np.ndarray) -> None:
    """Five distinct pixel positions per face: an infinite or astronomically large one (1e309) broke
    the alignment's fit with a LinAlgError, and five equal ones define no alignment at all."""
    bad = ~np.isfinite(landmarks).all(axis=(1, 2)) | (np.abs(landmarks) > MAX_LANDMARK).any(axis=(1, 2))
    if bad.any():
        line = int(np.flatnonzero(bad)[0])
        raise FacetrainError(
            f"{path} line {line + 1}: a landmark is {_first_out_of_range(landmarks[line])}, not a pixel position "
            f"in a photo (within +-{MAX_LANDMARK:g})"
        )
    collapsed = np.ptp(landmarks, axis=1).max(axis=1) == 0
    if collapsed.any():
        line = int(np.flatnonzero(collapsed)[0])
        raise FacetrainError(
            f"{path} line {line + 1}: the five landmarks are one point, which defines no alignment"
        )


def _first_out_of_range(points: np.ndarray) -> str:
    values = points.reshape(-1)
    return f"{values[~np.isfinite(values) | (np.abs(values) > MAX_LANDMARK)][0]:g}"


def _check_labels(path: Path, labels: np.ndarray) -> None:
    wrong = np.flatnonzero((labels != 0) & (labels != 1))
    if len(wrong):
        raise FacetrainError(
            f"{path} line {int(wrong[0]) + 1}: LABEL must be 1 (same person) or 0, got {labels[wrong[0]]}"
        )
    if labels.all() or not labels.any():
        kind = "matched" if labels.all() else "mismatched"
        raise FacetrainError(
            f"{path} holds {len(labels)} template pairs, all {kind}; TAR at FAR needs both matched and mismatched pairs"
        )


def _check_pair_templates(paths: dict[str, Path], pair_templates: np.ndarray, templates: np.ndarray) -> None:
    known = np.isin(pair_templates, np.unique(templates)).all(axis=1)
    if not known.all():
        line = int(np.flatnonzero(~known)[0])
        unknown = [t for t in pair_templates[line] if t not in set(templates.tolist())][0]
        raise FacetrainError(
            f"{paths['pairs']} line {line + 1}: template {unknown} has no face in {paths['faces']}"
        )


def _check_images_exist(root: Path, image_paths: list[str]) -> None:
    missing = [path for path in image_paths if not Path(path).is_file()]
    if missing:
        shown = ", ".join(missing[:MISSING_SHOWN]) + (", ..." if len(missing) > MISSING_SHOWN else "")
        raise FacetrainError(
            f"{len(missing)} of the {len(image_paths)} face images are missing from {root / CROPS_FOLDER} ({shown})"
        )
