"""Verification metrics against hand-computed cases, scikit-learn and a brute-force reference."""

from __future__ import annotations

import time

import numpy as np
import pytest
from scipy.optimize import brentq
from sklearn.metrics import roc_auc_score
from sklearn.metrics import roc_curve as sklearn_roc_curve

from facetrain.errors import FacetrainError
from facetrain.eval.folds import contiguous_folds
from facetrain.eval.metrics import (
    balanced_operating_point,
    best_threshold,
    cross_validated_accuracy,
    equal_error_rate,
    roc_curve,
    score_counts,
    true_accept_rates,
    verification_metrics,
)

HAND_SCORES = np.array([0.9, 0.8, 0.7, 0.6, 0.5, 0.4])
HAND_SAME = np.array([1, 1, 0, 1, 0, 0], dtype=bool)


def random_pairs(num_pairs: int, seed: int, decimals: int = 2) -> tuple[np.ndarray, np.ndarray]:
    """Overlapping score distributions, rounded so that ties occur."""
    rng = np.random.default_rng(seed)
    issame = rng.random(num_pairs) < 0.5
    scores = np.where(issame, rng.normal(0.5, 0.2, num_pairs), rng.normal(0.1, 0.2, num_pairs))
    return np.round(scores, decimals), issame


def test_hand_computed_roc_auc_eer_and_best_threshold():
    roc = roc_curve(HAND_SCORES, HAND_SAME)
    np.testing.assert_allclose(roc.true_positive_rate, [0, 1 / 3, 2 / 3, 2 / 3, 1, 1, 1])
    np.testing.assert_allclose(roc.false_positive_rate, [0, 0, 0, 1 / 3, 1 / 3, 2 / 3, 1])
    metrics = verification_metrics(HAND_SCORES, HAND_SAME, folds=np.array([0, 0, 0, 1, 1, 1]))
    assert metrics.auc == pytest.approx(8 / 9)
    assert metrics.eer == pytest.approx(1 / 3)
    assert best_threshold(HAND_SCORES, HAND_SAME) == pytest.approx((0.55, 5 / 6))
    point = metrics.operating_point
    assert point.threshold == pytest.approx(0.55), "a balanced set: the accuracy-best threshold"
    assert point.accuracy == pytest.approx(5 / 6)
    assert point.false_accept_rate == pytest.approx(1 / 3) and point.true_accept_rate == pytest.approx(1.0)
    assert metrics.baseline_accuracy == 0.5
    assert metrics.tar_at_far == {}, "3 mismatched pairs cannot resolve FAR 0.1"


def test_hand_computed_tar_at_far():
    positives = [0.95, 0.9, 0.5, 0.3]
    negatives = [0.92, 0.85, 0.4, 0.2, 0.1, 0.05, 0.04, 0.03, 0.02, 0.01]
    scores = np.array(positives + negatives)
    issame = np.array([True] * 4 + [False] * 10)
    roc = roc_curve(scores, issame)
    assert true_accept_rates(roc, num_mismatched=10) == {0.1: pytest.approx(0.5)}


def test_hand_computed_cross_validation():
    scores = np.array([0.9, 0.1, 0.8, 0.15, 0.3, 0.7])
    issame = np.array([True, False, True, False, True, False])
    folds = np.array([0, 0, 1, 1, 2, 2])
    results = cross_validated_accuracy(scores, issame, folds)
    assert [fold.threshold for fold in results] == pytest.approx([0.225, 0.2, 0.475])
    assert [fold.accuracy for fold in results] == pytest.approx([1.0, 1.0, 0.0])
    metrics = verification_metrics(scores, issame, folds)
    assert metrics.accuracy_mean == pytest.approx(2 / 3)
    assert metrics.accuracy_std == pytest.approx(np.sqrt(2 / 9))


def test_perfect_separation():
    scores = np.array([0.9, 0.8, 0.2, 0.1] * 5)
    issame = np.array([True, True, False, False] * 5)
    metrics = verification_metrics(scores, issame)
    assert metrics.accuracy_mean == 1.0 and metrics.accuracy_std == 0.0
    assert metrics.auc == 1.0 and metrics.eer == 0.0
    assert 0.2 < metrics.operating_point.threshold < 0.8


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_roc_matches_sklearn(seed: int):
    scores, issame = random_pairs(500, seed)
    ours = roc_curve(scores, issame)
    fpr, tpr, thresholds = sklearn_roc_curve(issame, scores, drop_intermediate=False)
    np.testing.assert_allclose(ours.false_positive_rate, fpr)
    np.testing.assert_allclose(ours.true_positive_rate, tpr)
    np.testing.assert_array_equal(ours.thresholds, thresholds)

    metrics = verification_metrics(scores, issame)
    assert metrics.auc == pytest.approx(roc_auc_score(issame, scores), abs=1e-12)
    for far, tar in metrics.tar_at_far.items():
        assert tar == pytest.approx(tpr[fpr <= far].max())
    assert set(metrics.tar_at_far) == {far for far in (1e-1, 1e-2) if far * (~issame).sum() >= 1}
    reference_eer = brentq(lambda x: 1.0 - np.interp(x, fpr, tpr) - x, 0.0, 1.0)
    assert equal_error_rate(ours) == pytest.approx(reference_eer, abs=1e-6)


def brute_force_best_threshold(scores: np.ndarray, issame: np.ndarray) -> tuple[float, float]:
    values = np.unique(scores)
    candidates = [values[0], *((values[:-1] + values[1:]) / 2), np.nextafter(values[-1], np.inf)]
    accuracies = [np.mean((scores >= t) == issame) for t in candidates]
    best = int(np.argmax(accuracies))
    return float(candidates[best]), float(accuracies[best])


@pytest.mark.parametrize("seed", [0, 1])
def test_score_counts_read_back_from_the_roc_are_the_scores_histogram(seed: int):
    rng = np.random.default_rng(seed)
    issame = rng.random(500) < 0.3
    scores = np.round(rng.normal(issame * 0.5, 0.2), 2)  # ties, as rounded scores have
    values, matched, mismatched = score_counts(
        roc_curve(scores, issame), int(issame.sum()), int((~issame).sum())
    )
    np.testing.assert_array_equal(values, np.unique(scores)[::-1])
    np.testing.assert_array_equal(matched, [np.sum(issame & (scores == value)) for value in values])
    np.testing.assert_array_equal(mismatched, [np.sum(~issame & (scores == value)) for value in values])


@pytest.mark.parametrize("seed", [3, 4])
def test_thresholds_and_fold_accuracy_match_brute_force(seed: int):
    scores, issame = random_pairs(300, seed, decimals=1)
    assert best_threshold(scores, issame) == pytest.approx(brute_force_best_threshold(scores, issame))
    folds = contiguous_folds(len(scores))
    for fold in cross_validated_accuracy(scores, issame, folds):
        test = folds == fold.fold
        threshold, _ = brute_force_best_threshold(scores[~test], issame[~test])
        assert fold.threshold == pytest.approx(threshold)
        assert fold.accuracy == pytest.approx(np.mean((scores[test] >= threshold) == issame[test]))


def brute_force_balanced_threshold(scores: np.ndarray, issame: np.ndarray) -> float:
    values = np.unique(scores)
    candidates = [values[0], *((values[:-1] + values[1:]) / 2), np.nextafter(values[-1], np.inf)]
    balanced = [((scores >= t)[issame].mean() + (scores < t)[~issame].mean()) / 2 for t in candidates]
    return float(candidates[int(np.argmax(balanced))])


@pytest.mark.parametrize("seed", [6, 7])
def test_balanced_threshold_matches_brute_force_on_a_skewed_set(seed: int):
    """On a set that is 91% mismatched, as all pairs of 10 people are, the deployed threshold must
    not be the accuracy-best one, which rejects most genuine pairs."""
    rng = np.random.default_rng(seed)
    issame = rng.random(3000) < 0.09
    scores = np.round(np.where(issame, rng.normal(0.5, 0.15, 3000), rng.normal(0.1, 0.15, 3000)), 3)
    point = balanced_operating_point(scores, issame)
    assert point.threshold == pytest.approx(brute_force_balanced_threshold(scores, issame))
    accepted = scores >= point.threshold
    assert point.false_accept_rate == pytest.approx(accepted[~issame].mean())
    assert point.true_accept_rate == pytest.approx(accepted[issame].mean())
    assert point.accuracy == pytest.approx(np.mean(accepted == issame))
    accuracy_best, _ = best_threshold(scores, issame)
    assert point.threshold < accuracy_best
    assert point.true_accept_rate > np.mean(scores[issame] >= accuracy_best)
    metrics = verification_metrics(scores, issame)
    assert metrics.baseline_accuracy == pytest.approx(1 - issame.mean())
    assert metrics.operating_point == point


def test_contiguous_folds_are_consecutive_blocks():
    folds = contiguous_folds(6000)
    assert np.array_equal(np.bincount(folds), [600] * 10)
    assert np.all(np.diff(folds) >= 0)
    assert np.array_equal(contiguous_folds(3), [0, 1, 2])


def test_six_thousand_pairs_in_well_under_a_second():
    scores, issame = random_pairs(6000, 5, decimals=6)
    folds = np.repeat(np.arange(10), 600)
    started = time.perf_counter()
    metrics = verification_metrics(scores, issame, folds)
    elapsed = time.perf_counter() - started
    assert elapsed < 1.0
    assert len(metrics.folds) == 10 and set(metrics.tar_at_far) == {0.1, 0.01, 0.001}


@pytest.mark.parametrize(
    ("scores", "issame", "folds", "message"),
    [
        ([0.5, 0.4], [True, True], None, "both matched and mismatched"),
        ([0.5, np.nan], [True, False], None, "non-finite"),
        ([0.5, 0.4], [True, False], [3, 3], "at least 2 folds"),
    ],
)
def test_degenerate_inputs_are_user_errors(scores, issame, folds, message):
    with pytest.raises(FacetrainError, match=message):
        verification_metrics(np.array(scores), np.array(issame), None if folds is None else np.array(folds))
