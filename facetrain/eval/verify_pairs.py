"""Face verification of a model on a pair set: the API the trainer and `facetrain eval` share.

    pairs = load_pairs("lfw/pairs.txt", images_root="lfw/aligned")
    result = verify(pairs, model, EmbedSettings(image_size=(112, 112)))
    print(result.accuracy, result.as_dict())

Scores are cosine similarities of the normalized (optionally flip-tested) embeddings.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from torch import nn

from facetrain.eval.embedding import EmbedSettings, compute_embeddings, embed_images
from facetrain.eval.metrics import VerificationMetrics, verification_metrics
from facetrain.eval.norm_summary import PairNorms
from facetrain.eval.one_kind import require_both_kinds
from facetrain.eval.pair_set import PairSet
from facetrain.eval.pairs import load_pairs
from facetrain.eval.set_names import KEPT_PAIRS_SUFFIX, report_name

THRESHOLD_RULE = "balanced: best mean of true-accept and true-reject rates on all pairs"

__all__ = [
    "KEPT_PAIRS_SUFFIX",
    "EmbedSettings",
    "PairSet",
    "VerificationResult",
    "embed_images",
    "load_pairs",
    "pair_scores",
    "report_name",
    "verify",
]


@dataclass(frozen=True)
class VerificationResult:
    """Metrics of one pair set plus what shaped them (flip test, folds, skipped pairs, XNorm) and the
    embedding norms before normalisation (`facetrain.eval.norm_summary`), None where not measured."""

    pairs_file: str
    metrics: VerificationMetrics
    xnorm: float
    flip: bool
    skipped_pairs: int
    missing_images: list[str]
    folds_source: str
    norms: PairNorms | None = None

    @property
    def name(self) -> str:
        return report_name(self.pairs_file)

    @property
    def accuracy(self) -> float:
        return self.metrics.accuracy_mean

    def as_dict(self) -> dict[str, Any]:
        """Plain JSON-ready figures; `threshold` is the one to deploy with, at the balanced operating point
        (best mean of true-accept and true-reject rates on all pairs), with the FAR and TAR it gives here.

        The per-fold table and the ROC points are left to the report files.
        """
        metrics = self.metrics
        point = metrics.operating_point
        return {
            "pairs_file": self.pairs_file,
            "num_pairs": metrics.num_pairs,
            "num_matched": metrics.num_matched,
            "num_mismatched": metrics.num_pairs - metrics.num_matched,
            "skipped_pairs": self.skipped_pairs,
            "missing_images": len(self.missing_images),
            "flip": self.flip,
            "accuracy": metrics.accuracy_mean,
            "accuracy_std": metrics.accuracy_std,
            "folds": len(metrics.folds),
            "folds_source": self.folds_source,
            "baseline_accuracy": metrics.baseline_accuracy,
            "threshold": point.threshold,
            "threshold_rule": THRESHOLD_RULE,
            "threshold_accuracy": point.accuracy,
            "threshold_far": point.false_accept_rate,
            "threshold_tar": point.true_accept_rate,
            "auc": metrics.auc,
            "eer": metrics.eer,
            "tar_at_far": {f"{far:g}": tar for far, tar in metrics.tar_at_far.items()},
            "xnorm": self.xnorm,
            **({} if self.norms is None else {"norms": self.norms.summary().as_dict()}),
        }


def pair_scores(embeddings: np.ndarray, pairs: PairSet) -> np.ndarray:
    """Cosine similarity of each pair, given L2-normalized embeddings of `pairs.images`."""
    return np.einsum("ij,ij->i", embeddings[pairs.left], embeddings[pairs.right])


def verify(pairs: PairSet, module: nn.Module, settings: EmbedSettings) -> VerificationResult:
    """Embed every image of `pairs` once, score the pairs and compute the verification metrics.

    A set of one kind of pair only (all matched, or all mismatched) is refused before anything is
    embedded: `facetrain.eval.one_kind` says what can be reported of it.
    """
    require_both_kinds(pairs)
    embeddings = compute_embeddings(module, pairs.images, settings, label=Path(pairs.source).name)
    folds, folds_source = pairs.cross_validation_folds()
    metrics = verification_metrics(pair_scores(embeddings.vectors, pairs), pairs.issame, folds)
    norms = PairNorms.of_pairs(embeddings.norms, pairs.left, pairs.right, pairs.issame)
    return VerificationResult(
        pairs.source,
        metrics,
        embeddings.xnorm,
        settings.flip,
        pairs.skipped_pairs,
        pairs.missing,
        folds_source,
        norms,
    )
