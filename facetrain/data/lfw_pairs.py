"""Verification pairs in the LFW View 2 `pairs.txt` format, drawn reproducibly from a set of identities.

The format: a header line `folds<TAB>pairs_per_fold`, then for each fold `pairs_per_fold` matched lines
`name<TAB>i<TAB>j` followed by `pairs_per_fold` mismatched lines `name1<TAB>i<TAB>name2<TAB>j`, where
image numbers count from 1 and name image k at `root/name/name_%04d.<ext>`.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from facetrain.errors import FacetrainError

MatchedPair = tuple[str, int, int]
MismatchedPair = tuple[str, int, str, int]


def draw_lfw_pairs(
    image_counts: dict[str, int], folds: int, pairs_per_fold: int, rng: np.random.Generator
) -> list[tuple[list[MatchedPair], list[MismatchedPair]]]:
    """Per fold, distinct matched and mismatched pairs; no pair appears twice in the whole file."""
    names = sorted(image_counts)
    repeatable = [name for name in names if image_counts[name] >= 2]
    if len(names) < 2 or not repeatable:
        raise FacetrainError("pairs need at least 2 identities and one identity with 2 or more images")
    matched_available = sum(image_counts[n] * (image_counts[n] - 1) // 2 for n in repeatable)
    needed = folds * pairs_per_fold
    if matched_available < needed:
        raise FacetrainError(
            f"{folds} folds x {pairs_per_fold} pairs need {needed} matched pairs but only "
            f"{matched_available} exist; use more held-out identities or images, or fewer pairs"
        )
    counts = np.array([image_counts[name] for name in names])
    mismatched_available = (counts.sum() ** 2 - (counts**2).sum()) // 2
    if mismatched_available < needed:
        raise FacetrainError(
            f"{folds} folds x {pairs_per_fold} pairs need {needed} mismatched pairs but only "
            f"{mismatched_available} exist; use more held-out identities or images, or fewer pairs"
        )
    seen: set[tuple] = set()
    result = []
    for _ in range(folds):
        matched: list[MatchedPair] = []
        while len(matched) < pairs_per_fold:
            name = repeatable[rng.integers(len(repeatable))]
            i, j = sorted(rng.choice(image_counts[name], size=2, replace=False) + 1)
            if (name, i, j) not in seen:
                seen.add((name, i, j))
                matched.append((name, int(i), int(j)))
        mismatched: list[MismatchedPair] = []
        while len(mismatched) < pairs_per_fold:
            first, second = sorted(rng.choice(len(names), size=2, replace=False))
            name1, name2 = names[first], names[second]
            pair = (
                name1,
                int(rng.integers(image_counts[name1])) + 1,
                name2,
                int(rng.integers(image_counts[name2])) + 1,
            )
            if pair not in seen:
                seen.add(pair)
                mismatched.append(pair)
        result.append((matched, mismatched))
    return result


def write_lfw_pairs(path: str | Path, folds: list[tuple[list[MatchedPair], list[MismatchedPair]]]) -> None:
    """Atomically write `folds` (as `draw_lfw_pairs` returns them) in LFW View 2 format."""
    per_fold = len(folds[0][0]) if folds else 0
    lines = [f"{len(folds)}\t{per_fold}"]
    for matched, mismatched in folds:
        if len(matched) != per_fold or len(mismatched) != per_fold:
            raise ValueError("every fold needs the same number of matched and mismatched pairs")
        lines.extend(f"{name}\t{i}\t{j}" for name, i, j in matched)
        lines.extend(f"{name1}\t{i}\t{name2}\t{j}" for name1, i, name2, j in mismatched)
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text("\n".join(lines) + "\n")
    os.replace(tmp, path)
