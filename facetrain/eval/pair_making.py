"""Balanced verification pairs from labelled images: every matched pair, as many mismatched ones.

Scoring every pair of a folder flatters a model: with ten people, 91% of all pairs are mismatched,
so answering "different" every time already scores 0.91. Here every matched pair is kept, the same
number of mismatched pairs is sampled uniformly (seeded, without repeats), and the pairs are dealt
into stratified folds, which is the shape of LFW's protocol.
"""

from __future__ import annotations

import csv
import io
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from facetrain.data.decode import image_file_problem, left_out_warnings
from facetrain.data.folder import scan_image_folder
from facetrain.errors import FacetrainError
from facetrain.eval.folds import DEFAULT_FOLD_SEED, DEFAULT_FOLDS, FOLDS_STRATIFIED, stratified_folds
from facetrain.eval.pair_set import PairSet
from facetrain.files import atomic_write_text, refuse_to_overwrite
from facetrain.logger import logger

SAMPLING_BATCH = 4096


@dataclass(frozen=True)
class PairPlan:
    """Pairs as indices into a list of images, with ground truth and fold ids."""

    left: np.ndarray
    right: np.ndarray
    issame: np.ndarray
    folds: np.ndarray


def balanced_pair_plan(
    labels: Sequence[int] | np.ndarray, seed: int = DEFAULT_FOLD_SEED, num_folds: int = DEFAULT_FOLDS
) -> PairPlan:
    """All matched pairs of `labels`, as many sampled mismatched pairs, in stratified folds.

    When fewer mismatched pairs exist than matched ones (one or two large identities), all of them
    are taken and the set stays unbalanced; the report's baseline shows it.
    """
    if seed < 0:
        raise FacetrainError(f"--seed {seed}: a seed is a whole number of 0 or more")
    labels = np.asarray(labels, dtype=np.int64)
    matched_left, matched_right = _matched_pairs(labels)
    if len(matched_left) == 0:
        raise FacetrainError("no identity has two images, so there is no matched pair to verify")
    if len(np.unique(labels)) < 2:
        raise FacetrainError("all images show one identity, so there is no mismatched pair to verify")
    rng = np.random.default_rng(seed)
    mismatched_left, mismatched_right = _sampled_mismatched_pairs(labels, len(matched_left), rng)
    issame = np.r_[np.ones(len(matched_left), bool), np.zeros(len(mismatched_left), bool)]
    return PairPlan(
        left=np.r_[matched_left, mismatched_left],
        right=np.r_[matched_right, mismatched_right],
        issame=issame,
        folds=stratified_folds(issame, num_folds, seed),
    )


def balanced_pair_set(
    paths: Sequence[str | Path],
    labels: Sequence[int] | np.ndarray,
    source: str,
    seed: int = DEFAULT_FOLD_SEED,
    num_folds: int = DEFAULT_FOLDS,
) -> PairSet:
    """A PairSet over labelled image paths (see `balanced_pair_plan`)."""
    plan = balanced_pair_plan(labels, seed, num_folds)
    return PairSet(
        source=source,
        images=[str(path) for path in paths],
        left=plan.left,
        right=plan.right,
        issame=plan.issame,
        folds=plan.folds,
        folds_source=FOLDS_STRATIFIED,
    )


def folder_pair_set(
    root: str | Path, seed: int = DEFAULT_FOLD_SEED, num_folds: int = DEFAULT_FOLDS
) -> PairSet:
    """Balanced pairs over an image folder `root/<identity>/<image>`.

    Files named like images that are not (a text file called .jpg, an empty download, a photo over
    facetrain's pixel limit) are left out with a warning naming them: in the pair set they would stop
    its evaluation half-way, after the model had embedded everything before them.
    """
    root = Path(root)
    if not root.is_dir():
        raise FacetrainError(f"{root} is not a folder; pass a folder of identities, ROOT/<identity>/<image>")
    table = scan_image_folder(root)
    problems = [image_file_problem(path) for path in table.reader.paths]
    kept = [index for index, problem in enumerate(problems) if problem is None]
    for line in left_out_warnings([problem for problem in problems if problem is not None]):
        logger.warning(line)
    if not kept:
        raise FacetrainError(f"none of the {len(problems)} files under {root} is a readable image")
    paths = [table.reader.paths[index] for index in kept]
    return balanced_pair_set(paths, table.labels[kept], os.path.abspath(root), seed, num_folds)


def write_pairs_csv(pairs: PairSet, out: str | Path, overwrite: bool = False) -> Path:
    """`path1,path2,same,fold` with paths relative to the CSV's folder, so it loads without --images."""
    out = Path(out)
    if not overwrite:
        refuse_to_overwrite([out])
    out.parent.mkdir(parents=True, exist_ok=True)
    base = os.path.abspath(out.parent)
    relative = [os.path.relpath(os.path.abspath(str(image)), base) for image in pairs.images]
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["path1", "path2", "same", "fold"])
    folds = pairs.folds if pairs.folds is not None else np.zeros(pairs.num_pairs, dtype=np.int64)
    for left, right, same, fold in zip(pairs.left, pairs.right, pairs.issame, folds):
        writer.writerow([relative[left], relative[right], int(same), int(fold)])
    atomic_write_text(out, buffer.getvalue())
    return out


def _matched_pairs(labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    left, right = [], []
    for label in np.unique(labels):
        members = np.flatnonzero(labels == label)
        first, second = np.triu_indices(len(members), k=1)
        left.append(members[first])
        right.append(members[second])
    return np.concatenate(left), np.concatenate(right)


def _sampled_mismatched_pairs(
    labels: np.ndarray, wanted: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """`wanted` distinct pairs of images with different labels, uniformly at random.

    Drawing random pairs and dropping repeats is fast while the wanted pairs are a small share of
    all mismatched pairs; when they are more than half, every mismatched pair is listed and a
    sample taken from the list instead.
    """
    counts = np.bincount(labels)
    available = (len(labels) ** 2 - int((counts.astype(np.int64) ** 2).sum())) // 2
    if wanted * 2 >= available:
        first, second = np.triu_indices(len(labels), k=1)
        different = labels[first] != labels[second]
        first, second = first[different], second[different]
        chosen = np.sort(rng.choice(len(first), size=min(wanted, len(first)), replace=False))
        return first[chosen], second[chosen]
    chosen: dict[tuple[int, int], None] = {}
    while len(chosen) < wanted:
        draws = rng.integers(0, len(labels), size=(SAMPLING_BATCH, 2))
        for one, other in draws:
            if labels[one] != labels[other]:
                chosen.setdefault((int(min(one, other)), int(max(one, other))), None)
                if len(chosen) == wanted:
                    break
    pairs = np.array(list(chosen), dtype=np.int64)
    return pairs[:, 0], pairs[:, 1]
