"""Cross-validation folds for pair sets that do not bring their own.

The folds decide which pairs a threshold is chosen on and which it is tested on. LFW View 2 defines
its folds, each half matched and half mismatched; a file without folds must get folds of the same
kind. Cutting such a file into consecutive blocks puts all its matched pairs in the first folds (they
are usually listed first), so each threshold is chosen on a skewed mix and tested on a one-sided
fold, which under-reports accuracy by several points.
"""

from __future__ import annotations

import numpy as np

from facetrain.choices import DEFAULT_FOLD_SEED, DEFAULT_FOLDS
from facetrain.errors import FacetrainError

FOLDS_FROM_FILE = "the file's"
FOLDS_IN_FILE_ORDER = "consecutive blocks in file order"
FOLDS_STRATIFIED = "stratified"


def stratified_folds(
    issame: np.ndarray, num_folds: int = DEFAULT_FOLDS, seed: int = DEFAULT_FOLD_SEED
) -> np.ndarray:
    """Fold ids giving every fold the same share of matched and of mismatched pairs.

    Pairs are dealt round-robin in a seeded random order, matched pairs first and mismatched pairs
    continuing where they stopped, so fold sizes differ by at most one and the result depends only on
    `issame` and `seed`.
    """
    issame = np.asarray(issame, dtype=bool)
    num_folds = _usable_folds(len(issame), num_folds)
    rng = np.random.default_rng(seed)
    folds = np.empty(len(issame), dtype=np.int64)
    dealt = 0
    for members in (np.flatnonzero(issame), np.flatnonzero(~issame)):
        folds[rng.permutation(members)] = (dealt + np.arange(len(members))) % num_folds
        dealt += len(members)
    return folds


def contiguous_folds(num_pairs: int, num_folds: int = DEFAULT_FOLDS) -> np.ndarray:
    """Consecutive blocks: the folds of insightface .bin files, whose pairs are stored in LFW's fold order."""
    num_folds = _usable_folds(num_pairs, num_folds)
    return np.repeat(
        np.arange(num_folds), [len(block) for block in np.array_split(np.arange(num_pairs), num_folds)]
    )


def _usable_folds(num_pairs: int, num_folds: int) -> int:
    if num_pairs < 2:
        raise FacetrainError(f"verification needs at least 2 pairs, got {num_pairs}")
    if num_folds < 2:
        raise FacetrainError(f"cross-validation needs at least 2 folds, got {num_folds}")
    return min(num_folds, num_pairs)
