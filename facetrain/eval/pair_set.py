"""A verification pair set in the one shape every pairs format is turned into.

Images are stored once however many pairs use them (LFW's 6,000 pairs share about 7,700 images), and
pairs point into that list, so each image is embedded exactly once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from facetrain.errors import FacetrainError
from facetrain.eval.folds import FOLDS_FROM_FILE, FOLDS_STRATIFIED, stratified_folds

MISSING_SHOWN = 3


@dataclass
class PairSet:
    """Pairs of images with ground truth and, when the file defines them, cross-validation folds.

    `images` holds paths (str) or encoded image bytes; `left[k]`, `right[k]` index the two images of
    pair k. `folds_source` says where `folds` came from. `missing` and `skipped_pairs` record what
    `skip_missing` dropped.
    """

    source: str
    images: list[str | bytes]
    left: np.ndarray
    right: np.ndarray
    issame: np.ndarray
    folds: np.ndarray | None = None
    folds_source: str = FOLDS_FROM_FILE
    missing: list[str] = field(default_factory=list)
    skipped_pairs: int = 0

    @property
    def num_pairs(self) -> int:
        return len(self.issame)

    @property
    def num_matched(self) -> int:
        return int(self.issame.sum())

    def cross_validation_folds(self) -> tuple[np.ndarray, str]:
        """The file's folds, or stratified ones when it has none, and which of the two they are."""
        if self.folds is not None:
            return self.folds, self.folds_source
        return stratified_folds(self.issame), FOLDS_STRATIFIED


def _is_file(path: Path) -> bool:
    """Whether a pairs file's image exists; a name the system cannot even look up (a NUL byte, over
    255 bytes) is as missing as any, not a ValueError or ENAMETOOLONG traceback."""
    try:
        return path.is_file()
    except (OSError, ValueError):
        return False


def pair_set_from_paths(
    source: str | Path,
    paths: Sequence[tuple[Path, Path]],
    issame: Sequence[bool],
    folds: Sequence[int] | None,
    skip_missing: bool,
) -> PairSet:
    """Check every image exists, then index them; missing ones fail loudly or drop their pairs.

    A fold column holding a single fold is no fold at all: the pairs get stratified folds instead.
    """
    exists: dict[Path, bool] = {}
    for pair in paths:
        for path in pair:
            if path not in exists:
                exists[path] = _is_file(path)
    missing = [str(path) for path, found in exists.items() if not found]
    keep = [exists[first] and exists[second] for first, second in paths]
    if missing and not skip_missing:
        shown = ", ".join(path[:200] for path in missing[:MISSING_SHOWN]) + (
            ", ..." if len(missing) > MISSING_SHOWN else ""
        )
        raise FacetrainError(
            f"{source}: {len(missing)} images used by {keep.count(False)} pairs are missing ({shown}); "
            "point --images at the image root, or pass --skip-missing to drop those pairs"
        )
    if not any(keep):
        raise FacetrainError(f"{source}: none of the {len(paths)} pairs has both of its images")
    index: dict[Path, int] = {}
    left, right = [], []
    for (first, second), kept in zip(paths, keep):
        if kept:
            left.append(index.setdefault(first, len(index)))
            right.append(index.setdefault(second, len(index)))
    kept_mask = np.array(keep)
    kept_folds = None if folds is None else np.asarray(folds, dtype=np.int64)[kept_mask]
    if kept_folds is not None and len(np.unique(kept_folds)) < 2:
        kept_folds = None
    return PairSet(
        source=str(source),
        images=[str(path) for path in index],
        left=np.array(left, dtype=np.int64),
        right=np.array(right, dtype=np.int64),
        issame=np.asarray(issame, dtype=bool)[kept_mask],
        folds=kept_folds,
        missing=missing,
        skipped_pairs=keep.count(False),
    )
