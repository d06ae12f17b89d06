"""Pair sets of one kind only: every pair matched (insightface's sample small_lfw.bin holds 10 matched
pairs) or every pair mismatched.

Accuracy, a threshold, the ROC, EER and TAR at FAR all weigh matched pairs against mismatched ones, so
none of them exists for such a set. What does: how alike the model finds the pairs (similarity
statistics), and how many of them a given threshold accepts (the TAR of matched pairs, the FAR of
mismatched ones). The labels are checked before any image is embedded, so a user learns this at once,
not after minutes of embedding.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from torch import nn

from facetrain.errors import FacetrainError
from facetrain.eval.embedding import EmbedSettings, compute_embeddings
from facetrain.eval.norm_summary import NormSummary, summarize_norms
from facetrain.eval.pair_set import PairSet
from facetrain.eval.set_names import report_name
from facetrain.files import atomic_write_text

PERCENTILES = (5, 50, 95)


def pair_counts(pairs: PairSet) -> str:
    """`10 pairs: 10 matched, 0 mismatched`."""
    return f"{pairs.num_pairs} pairs: {pairs.num_matched} matched, {pairs.num_pairs - pairs.num_matched} mismatched"


def one_kind_problem(pairs: PairSet) -> str | None:
    """Why `pairs` cannot be scored as verification, naming its file and counts; None when it holds both
    kinds of pair."""
    if 0 < pairs.num_matched < pairs.num_pairs:
        return None
    missing = "mismatched" if pairs.num_matched else "matched"
    return (
        f"{pairs.source} holds {pair_counts(pairs)}; verification accuracy, its threshold, ROC and TAR at "
        f"FAR need {missing} pairs too"
    )


ONE_KIND_FIX = (
    "use a pack with both (lfw.bin holds 3,000 of each), or `facetrain eval` it for similarity statistics"
)


def require_both_kinds(pairs: PairSet, fix: str = ONE_KIND_FIX) -> None:
    """Refuse a one-kind set before embedding it, in one line that says what would work (`fix`)."""
    problem = one_kind_problem(pairs)
    if problem is not None:
        raise FacetrainError(f"{problem}; {fix}")


@dataclass(frozen=True)
class OneKindResult:
    """What can be said of a one-kind set: the similarity statistics of its pairs, and the share of them
    `threshold` accepts (None: no threshold was given, and the reason why is in `threshold_source`)."""

    pairs_file: str
    matched: bool
    scores: np.ndarray
    threshold: float | None
    threshold_source: str
    xnorm: float
    flip: bool
    skipped_pairs: int
    norms: NormSummary | None = None  # of the set's images, before normalisation (`eval.norm_summary`)

    @property
    def name(self) -> str:
        return report_name(self.pairs_file)

    @property
    def rate_name(self) -> str:
        """What the accepted share is: the true-accept rate of matched pairs, the false-accept rate of
        mismatched ones."""
        return "TAR" if self.matched else "FAR"

    @property
    def accepted(self) -> int | None:
        return None if self.threshold is None else int((self.scores >= self.threshold).sum())

    def similarity(self) -> dict[str, float]:
        scores = self.scores
        return {
            "mean": float(scores.mean()),
            "std": float(scores.std()),
            "min": float(scores.min()),
            **{f"p{p}": float(np.percentile(scores, p)) for p in PERCENTILES},
            "max": float(scores.max()),
        }

    def as_dict(self) -> dict[str, Any]:
        num_pairs = len(self.scores)
        accepted = self.accepted
        return {
            "pairs_file": self.pairs_file,
            "num_pairs": num_pairs,
            "num_matched": num_pairs if self.matched else 0,
            "num_mismatched": 0 if self.matched else num_pairs,
            "skipped_pairs": self.skipped_pairs,
            "flip": self.flip,
            "one_kind": "matched" if self.matched else "mismatched",
            "similarity": self.similarity(),
            "threshold": self.threshold,
            "threshold_source": self.threshold_source,
            self.rate_name.lower(): None if accepted is None else accepted / num_pairs,
            "xnorm": self.xnorm,
            **({} if self.norms is None else {"norms": self.norms.as_dict()}),
        }


def score_one_kind(
    pairs: PairSet,
    module: nn.Module,
    settings: EmbedSettings,
    threshold: float | None,
    threshold_source: str,
) -> OneKindResult:
    """Embed the set's images and score its pairs by cosine similarity."""
    if one_kind_problem(pairs) is None:
        raise ValueError(f"{pairs.source} holds both kinds of pair; score it with verify_pairs.verify")
    embeddings = compute_embeddings(module, pairs.images, settings, label=Path(pairs.source).name)
    vectors = embeddings.vectors
    scores = np.einsum("ij,ij->i", vectors[pairs.left], vectors[pairs.right]).astype(np.float64)
    return OneKindResult(
        pairs.source, bool(pairs.num_matched), scores, threshold, threshold_source, embeddings.xnorm, settings.flip,
        pairs.skipped_pairs, summarize_norms(embeddings.norms),
    )  # fmt: skip


def one_kind_table(result: OneKindResult) -> str:
    stats = result.similarity()
    kind = "matched" if result.matched else "mismatched"
    num_pairs = len(result.scores)
    rows = [
        ("pairs file", result.pairs_file),
        ("pairs", f"{num_pairs}, all {kind} ({result.skipped_pairs} skipped)"),
        ("flip test", "on" if result.flip else "off"),
        (
            "similarity",
            f"mean {stats['mean']:.4f} ± {stats['std']:.4f}, min {stats['min']:.4f}, max {stats['max']:.4f}",
        ),
        ("percentiles", ", ".join(f"p{p} {stats[f'p{p}']:.4f}" for p in PERCENTILES)),
    ]
    if result.threshold is None:
        rows.append((result.rate_name, f"not shown: {result.threshold_source}"))
    else:
        rate = result.accepted / num_pairs
        rows.append(
            (
                f"{result.rate_name} @ {result.threshold:.4f}",
                f"{100 * rate:.2f}% ({result.accepted} of {num_pairs} accepted; threshold {result.threshold_source})",
            )
        )
    rows.append(("XNorm", f"{result.xnorm:.3f}"))
    if result.norms is not None:
        rows.append(("norms", result.norms.describe()))
    width = max(len(label) for label, _ in rows)
    return "\n".join(f"{label:<{width}}  {value}" for label, value in rows)


def write_one_kind_report(
    result: OneKindResult, out_dir: str | Path, extra: dict[str, Any] | None = None, name: str | None = None
) -> list[Path]:
    """`<name>.json` in `out_dir` (`name` defaults to the set's own); `extra` joins the JSON."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{name or result.name}.json"
    atomic_write_text(path, json.dumps({**(extra or {}), **result.as_dict()}, indent=2) + "\n")
    return [path]
