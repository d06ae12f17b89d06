"""Pair files without folds of their own get stratified folds, so every fold is half matched."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest

from facetrain.eval.folds import (
    FOLDS_FROM_FILE,
    FOLDS_IN_FILE_ORDER,
    FOLDS_STRATIFIED,
    contiguous_folds,
    stratified_folds,
)
from facetrain.eval.metrics import best_threshold, verification_metrics
from facetrain.eval.pairs import load_pairs
from tests.support.eval_sets import touch_lfw_images

PEOPLE = 40


def write_one_fold_lfw(path: Path, header: str) -> None:
    """600 pairs, the 300 matched listed first, as LFW View 1 and one-fold files list them."""
    rng = np.random.default_rng(0)
    lines = [header] if header else []
    for _ in range(300):
        person = rng.integers(PEOPLE)
        lines.append(f"p{person}\t1\t2")
    for _ in range(300):
        one, other = rng.choice(PEOPLE, 2, replace=False)
        lines.append(f"p{one}\t1\tp{other}\t2")
    path.write_text("\n".join(lines) + "\n")
    touch_lfw_images(path.parent, {f"p{person}": 2 for person in range(PEOPLE)})


@pytest.mark.parametrize("header", ["300", "1\t300", ""], ids=["view1", "one-fold", "no-header"])
def test_a_600_pair_file_without_folds_gets_matched_pairs_in_every_fold(tmp_path: Path, header: str):
    write_one_fold_lfw(tmp_path / "pairs.txt", header)
    pairs = load_pairs(tmp_path / "pairs.txt")
    assert pairs.folds is None
    folds, source = pairs.cross_validation_folds()
    assert source == FOLDS_STRATIFIED
    assert np.bincount(folds[pairs.issame]).tolist() == [30] * 10
    assert np.bincount(folds[~pairs.issame]).tolist() == [30] * 10
    again, _ = load_pairs(tmp_path / "pairs.txt").cross_validation_folds()
    np.testing.assert_array_equal(folds, again)


def test_stratified_folds_are_seeded_and_balanced_with_uneven_counts():
    issame = np.r_[np.ones(45, bool), np.zeros(57, bool)]
    folds = stratified_folds(issame, num_folds=10, seed=0)
    assert np.bincount(folds).max() - np.bincount(folds).min() <= 1
    matched_per_fold = np.bincount(folds[issame], minlength=10)
    assert matched_per_fold.max() - matched_per_fold.min() <= 1
    np.testing.assert_array_equal(folds, stratified_folds(issame, num_folds=10, seed=0))
    assert not np.array_equal(folds, stratified_folds(issame, num_folds=10, seed=1))
    assert len(np.unique(stratified_folds(issame[:3], num_folds=10))) == 3, "no empty folds"


def test_a_csv_without_a_fold_column_or_with_one_fold_is_stratified(tmp_path: Path):
    touch_lfw_images(tmp_path, {"a": 4, "b": 4})
    rows = [("a/a_0001.jpg", "a/a_0002.jpg", 1), ("a/a_0003.jpg", "a/a_0004.jpg", 1)]
    rows += [("a/a_0001.jpg", "b/b_0001.jpg", 0), ("a/a_0002.jpg", "b/b_0002.jpg", 0)]
    (tmp_path / "plain.csv").write_text("".join(f"{x},{y},{same}\n" for x, y, same in rows))
    (tmp_path / "one.csv").write_text("".join(f"{x},{y},{same},3\n" for x, y, same in rows))
    (tmp_path / "own.csv").write_text(
        "".join(f"{x},{y},{same},{k % 2}\n" for k, (x, y, same) in enumerate(rows))
    )
    for name in ("plain.csv", "one.csv"):
        pairs = load_pairs(tmp_path / name)
        folds, source = pairs.cross_validation_folds()
        assert pairs.folds is None and source == FOLDS_STRATIFIED
        assert sorted(folds[pairs.issame].tolist()) == [0, 1], "each matched pair in its own fold"
    own = load_pairs(tmp_path / "own.csv")
    folds, source = own.cross_validation_folds()
    assert source == FOLDS_FROM_FILE and folds.tolist() == [0, 1, 0, 1]


def test_bin_files_keep_their_consecutive_folds(tmp_path: Path):
    path = tmp_path / "lfw.bin"
    issame = ([True] * 3 + [False] * 3) * 10
    path.write_bytes(pickle.dumps(([b"img"] * 120, issame), protocol=4))
    folds, source = load_pairs(path).cross_validation_folds()
    assert source == FOLDS_IN_FILE_ORDER
    np.testing.assert_array_equal(folds, contiguous_folds(60))


@pytest.mark.parametrize("seed", [0, 3, 5])
def test_consecutive_blocks_under_report_what_stratified_folds_measure(seed: int):
    """The defect that made stratified folds the default: 300 matched pairs listed before 300
    mismatched ones, cut into 10 blocks, put each fold's threshold on a one-sided sample."""
    rng = np.random.default_rng(seed)
    issame = np.r_[np.ones(300, bool), np.zeros(300, bool)]
    scores = np.where(issame, rng.normal(0.5, 0.15, 600), rng.normal(0.25, 0.15, 600))
    _, ceiling = best_threshold(scores, issame)  # the threshold chosen on the test pairs themselves
    stratified = verification_metrics(scores, issame).accuracy_mean
    blocks = verification_metrics(scores, issame, contiguous_folds(600)).accuracy_mean
    assert ceiling - 0.03 <= stratified <= ceiling
    assert blocks < stratified - 0.01
