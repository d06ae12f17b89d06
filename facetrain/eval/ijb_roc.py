"""TAR at FAR as IJB-B / IJB-C results are reported: insightface's eval_ijbc.py rule, exactly.

eval_ijbc.py takes scikit-learn's `roc_curve` (which drops the ROC points lying on a straight line
between their neighbours) and, for each target FAR, reports the TPR of the point whose FPR is nearest
to the target, above or below it, the point with the larger FPR (and TPR) on a tie. Papers' IJB tables
are made this way, so facetrain's are too; the ROC is computed here from sorted cumulative counts so
the 15.7 million IJB-C scores need no scikit-learn (the tests hold it to scikit-learn's).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from facetrain.errors import FacetrainError

IJB_FALSE_ACCEPT_RATES = (1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1)
PLOTTED_POINTS = 2000  # ROC points kept for the plot and the report, spread evenly over log FAR


@dataclass(frozen=True)
class IjbRoc:
    """The ROC as eval_ijbc.py sees it (increasing FPR), its AUC and the TAR at each target FAR."""

    false_positive_rate: np.ndarray
    true_positive_rate: np.ndarray
    auc: float
    tar_at_far: dict[float, float]


def ijb_roc(
    labels: np.ndarray, scores: np.ndarray, fars: tuple[float, ...] = IJB_FALSE_ACCEPT_RATES
) -> IjbRoc:
    labels, scores = np.asarray(labels, dtype=bool), np.asarray(scores, dtype=np.float64)
    if labels.all() or not labels.any():
        raise FacetrainError("TAR at FAR needs both matched and mismatched template pairs")
    if not np.isfinite(scores).all():
        raise FacetrainError(
            "template similarities contain NaN or infinity; the model produced non-finite features"
        )
    fpr, tpr = roc_points(labels, scores)
    return IjbRoc(
        fpr, tpr, float(np.trapezoid(tpr, fpr)), {far: nearest_far_tar(fpr, tpr, far) for far in fars}
    )


def roc_points(labels: np.ndarray, scores: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's `roc_curve(labels, scores)` FPR and TPR (drop_intermediate=True), increasing."""
    order = np.argsort(-scores, kind="stable")
    sorted_scores = scores[order]
    last_of_each_score = np.r_[np.flatnonzero(np.diff(sorted_scores)), len(scores) - 1]
    true_positives = np.cumsum(labels[order])[last_of_each_score]
    false_positives = last_of_each_score + 1 - true_positives
    if len(true_positives) > 2:  # keep the corners: drop points collinear with both neighbours
        corner = np.r_[True, (np.diff(false_positives, 2) != 0) | (np.diff(true_positives, 2) != 0), True]
        true_positives, false_positives = true_positives[corner], false_positives[corner]
    fpr = np.r_[0.0, false_positives / false_positives[-1]]
    tpr = np.r_[0.0, true_positives / true_positives[-1]]
    return fpr, tpr


def nearest_far_tar(fpr: np.ndarray, tpr: np.ndarray, far: float) -> float:
    """The TPR at the ROC point nearest to `far`; on a tie, the one eval_ijbc.py's search over the
    reversed curve meets first: the larger FPR, then the larger TPR."""
    distance = np.abs(fpr[::-1] - far)
    return float(tpr[::-1][int(np.argmin(distance))])


def plotted_points(roc: IjbRoc) -> tuple[np.ndarray, np.ndarray]:
    """At most about PLOTTED_POINTS points of the curve, evenly spread over log FAR, with each chosen
    FPR's highest TPR, so a plot of millions of pairs stays light and keeps the curve's shape."""
    fpr, tpr = roc.false_positive_rate, roc.true_positive_rate
    shown = np.flatnonzero(fpr > 0)
    if len(shown) <= PLOTTED_POINTS:
        return fpr[shown], tpr[shown]
    grid = np.logspace(np.log10(fpr[shown[0]]), 0, PLOTTED_POINTS)
    # the last point at or below each grid FPR: at equal FPR, the highest TPR (TPR increases along the curve)
    picks = np.unique(np.searchsorted(fpr, grid, side="right") - 1)
    picks = picks[fpr[picks] > 0]
    return fpr[picks], tpr[picks]
