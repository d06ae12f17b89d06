"""Verification metrics computed from similarity scores alone, so they are testable without a model.

Everything here works on three aligned arrays: `scores` (higher means more alike, e.g. cosine
similarity), `issame` (the ground truth) and `folds` (which cross-validation fold each pair is in).
The ROC is computed here with sorted cumulative counts rather than taken from scikit-learn so the
same pass also yields the accuracy of every candidate threshold; the tests hold it to scikit-learn's
`roc_curve` on the same scores.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from facetrain.errors import FacetrainError
from facetrain.eval.folds import stratified_folds

FALSE_ACCEPT_RATES = (1e-1, 1e-2, 1e-3)


@dataclass(frozen=True)
class RocCurve:
    """ROC points ordered by decreasing threshold; a pair is accepted when its score >= threshold."""

    false_positive_rate: np.ndarray
    true_positive_rate: np.ndarray
    thresholds: np.ndarray


@dataclass(frozen=True)
class FoldResult:
    fold: int
    num_pairs: int
    threshold: float
    accuracy: float


@dataclass(frozen=True)
class OperatingPoint:
    """A threshold to decide with and what it does on the pairs it was chosen on."""

    threshold: float
    accuracy: float
    false_accept_rate: float
    true_accept_rate: float


@dataclass(frozen=True)
class VerificationMetrics:
    """The verification figures of one pair set; `roc` is kept for plotting but not for JSON.

    `baseline_accuracy` is what answering the more frequent answer every time scores ("different"
    on all-pairs sets), the floor against which `accuracy_mean` means anything.
    """

    num_pairs: int
    num_matched: int
    accuracy_mean: float
    accuracy_std: float
    folds: list[FoldResult]
    operating_point: OperatingPoint
    baseline_accuracy: float
    auc: float
    eer: float
    tar_at_far: dict[float, float]
    roc: RocCurve = field(repr=False)


def roc_curve(scores: np.ndarray, issame: np.ndarray) -> RocCurve:
    """ROC with one point per distinct score plus the (0, 0) start, like sklearn's drop_intermediate=False."""
    scores, issame = _validated(scores, issame)
    order = np.argsort(-scores, kind="stable")
    sorted_scores = scores[order]
    true_positives = np.cumsum(issame[order])
    false_positives = np.arange(1, len(scores) + 1) - true_positives
    last_of_each_score = np.r_[np.flatnonzero(np.diff(sorted_scores)), len(scores) - 1]
    tpr = np.r_[0.0, true_positives[last_of_each_score] / true_positives[-1]]
    fpr = np.r_[0.0, false_positives[last_of_each_score] / false_positives[-1]]
    thresholds = np.r_[np.inf, sorted_scores[last_of_each_score]]
    return RocCurve(fpr, tpr, thresholds)


def score_counts(
    roc: RocCurve, num_matched: int, num_mismatched: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every distinct score with its number of matched and of mismatched pairs, read back from the ROC.

    The ROC keeps one point per distinct score and its steps are those counts over the class sizes, so
    the genuine and impostor score histograms need no copy of the scores beside it.
    """
    matched = np.rint(np.diff(roc.true_positive_rate) * num_matched).astype(np.int64)
    mismatched = np.rint(np.diff(roc.false_positive_rate) * num_mismatched).astype(np.int64)
    return roc.thresholds[1:], matched, mismatched


def area_under_curve(roc: RocCurve) -> float:
    return float(np.trapezoid(roc.true_positive_rate, roc.false_positive_rate))


def equal_error_rate(roc: RocCurve) -> float:
    """Where the false-reject rate meets the false-accept rate, interpolated along the ROC segment."""
    gap = (1.0 - roc.true_positive_rate) - roc.false_positive_rate
    crossing = int(np.argmax(gap <= 0))
    before, after = gap[crossing - 1], gap[crossing]
    fraction = before / (before - after)
    fpr = roc.false_positive_rate
    return float(fpr[crossing - 1] + fraction * (fpr[crossing] - fpr[crossing - 1]))


def true_accept_rates(roc: RocCurve, num_mismatched: int) -> dict[float, float]:
    """TAR at each standard FAR that the mismatched pairs can resolve (FAR x mismatched >= 1)."""
    rates = {}
    for far in FALSE_ACCEPT_RATES:
        if far * num_mismatched >= 1:
            rates[far] = float(roc.true_positive_rate[roc.false_positive_rate <= far].max())
    return rates


def best_threshold(scores: np.ndarray, issame: np.ndarray) -> tuple[float, float]:
    """The threshold with the highest accuracy on these pairs, and that accuracy.

    Candidates lie midway between consecutive distinct scores (plus one accepting everything and one
    rejecting everything), so a threshold never sits on a training score; ties go to the lowest.
    """
    threshold, correct = _best_cut(scores, issame, matched_weight=1.0, mismatched_weight=1.0)
    return threshold, correct / len(scores)


def balanced_operating_point(scores: np.ndarray, issame: np.ndarray) -> OperatingPoint:
    """The threshold with the best balanced accuracy, the mean of the true-accept and true-reject rates.

    Plain accuracy on a set that is 91% mismatched rewards rejecting almost everything, so the
    threshold it picks calls most genuine pairs "different". Weighting each class by the inverse of
    its count gives the threshold that would be best on balanced pairs, whatever the set's mix; on a
    balanced set it is the accuracy-best threshold.
    """
    num_matched = int(issame.sum())
    threshold, _ = _best_cut(
        scores, issame, matched_weight=1.0 / num_matched, mismatched_weight=1.0 / (len(scores) - num_matched)
    )
    accepted = scores >= threshold
    return OperatingPoint(
        threshold=threshold,
        accuracy=float(np.mean(accepted == issame)),
        false_accept_rate=float(accepted[~issame].mean()),
        true_accept_rate=float(accepted[issame].mean()),
    )


def _best_cut(
    scores: np.ndarray, issame: np.ndarray, matched_weight: float, mismatched_weight: float
) -> tuple[float, float]:
    """The lowest threshold maximizing the weighted count of correct decisions, and that count."""
    order = np.argsort(scores, kind="stable")
    sorted_scores, sorted_same = scores[order], issame[order]
    rejected_mismatches = np.r_[0, np.cumsum(~sorted_same)]
    rejected_matches = np.r_[0, np.cumsum(sorted_same)]
    cuts = np.r_[0, np.flatnonzero(np.diff(sorted_scores)) + 1, len(scores)]
    correct = mismatched_weight * rejected_mismatches[cuts] + matched_weight * (
        rejected_matches[-1] - rejected_matches[cuts]
    )
    best = int(np.argmax(correct))
    cut = cuts[best]
    if cut == 0:
        threshold = sorted_scores[0]
    elif cut == len(scores):
        threshold = np.nextafter(sorted_scores[-1], np.inf)
    else:
        threshold = (sorted_scores[cut - 1] + sorted_scores[cut]) / 2
    return float(threshold), float(correct[best])


def accuracy_at(scores: np.ndarray, issame: np.ndarray, threshold: float) -> float:
    return float(np.mean((scores >= threshold) == issame))


def cross_validated_accuracy(scores: np.ndarray, issame: np.ndarray, folds: np.ndarray) -> list[FoldResult]:
    """Each fold scored at the threshold that is best on all the other folds."""
    results = []
    for fold in np.unique(folds):
        test = folds == fold
        threshold, _ = best_threshold(scores[~test], issame[~test])
        results.append(
            FoldResult(
                int(fold), int(test.sum()), threshold, accuracy_at(scores[test], issame[test], threshold)
            )
        )
    return results


def verification_metrics(
    scores: np.ndarray, issame: np.ndarray, folds: np.ndarray | None = None
) -> VerificationMetrics:
    """All verification figures; without `folds`, 10 stratified folds (seed 0) are made."""
    scores, issame = _validated(scores, issame)
    folds = stratified_folds(issame) if folds is None else np.asarray(folds)
    if folds.shape != scores.shape:
        raise ValueError(f"folds has shape {folds.shape}, scores {scores.shape}")
    if len(np.unique(folds)) < 2:
        raise FacetrainError("verification needs at least 2 folds to choose thresholds on held-out pairs")
    fold_results = cross_validated_accuracy(scores, issame, folds)
    accuracies = np.array([fold.accuracy for fold in fold_results])
    roc = roc_curve(scores, issame)
    num_matched = int(issame.sum())
    return VerificationMetrics(
        num_pairs=len(scores),
        num_matched=num_matched,
        accuracy_mean=float(accuracies.mean()),
        accuracy_std=float(accuracies.std()),
        folds=fold_results,
        operating_point=balanced_operating_point(scores, issame),
        baseline_accuracy=max(num_matched, len(scores) - num_matched) / len(scores),
        auc=area_under_curve(roc),
        eer=equal_error_rate(roc),
        tar_at_far=true_accept_rates(roc, len(scores) - num_matched),
        roc=roc,
    )


def _validated(scores: np.ndarray, issame: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    scores = np.asarray(scores, dtype=np.float64)
    issame = np.asarray(issame, dtype=bool)
    if scores.ndim != 1 or scores.shape != issame.shape:
        raise ValueError(f"scores {scores.shape} and issame {issame.shape} must be aligned 1-D arrays")
    if not np.isfinite(scores).all():
        raise FacetrainError(
            "verification scores contain NaN or infinity; the model produced non-finite embeddings"
        )
    if issame.all() or not issame.any():
        raise FacetrainError("verification needs both matched and mismatched pairs")
    return scores, issame
