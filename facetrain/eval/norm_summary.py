"""The distribution of the embedding norms before normalisation, as an evaluation reports it.

Verification scores directions only, but the norm the model gives an image is worth reading beside
them: magnitude-aware margins (MagFace, AdaFace) train it into a quality score, plain margin-softmax
training drives it up (XNorm is its mean), and a collapse shows there first. The report gives its
quantiles over the evaluated images and, for pairs, the lower norm of each pair split by matched and
mismatched, since a pair is only as reliable as its poorer image.

A model that normalises its embedding inside (an export with a final L2 layer) gives norm 1 for every
image; the summary says so instead of showing a spike.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

# the quantiles reported, by name: the extremes, the tails a quality threshold would cut, the middle
NORM_QUANTILES = {"min": 0.0, "p5": 0.05, "median": 0.5, "p95": 0.95, "max": 1.0}
# how close to 1 every norm must be for the model to count as normalising inside (fp16 exports round)
UNIT_NORM_TOLERANCE = 1e-3


@dataclass(frozen=True)
class NormSummary:
    """Quantiles of the raw norms of `count` images; `unit` when every one is 1 (normalised inside)."""

    count: int
    quantiles: dict[str, float]
    unit: bool

    def as_dict(self) -> dict[str, Any]:
        return {"images": self.count, **self.quantiles, "normalized_inside": self.unit}

    def describe(self) -> str:
        """One table cell: the quantiles, or why there are none worth showing."""
        if self.unit:
            return "1 for every image: the model normalises its embedding inside"
        return ", ".join(f"{name} {value:.2f}" for name, value in self.quantiles.items())


def summarize_norms(norms: np.ndarray) -> NormSummary:
    norms = np.asarray(norms, dtype=np.float64)
    if norms.size == 0:
        raise ValueError("no norms to summarise")
    values = np.quantile(norms, list(NORM_QUANTILES.values()))
    quantiles = {name: float(value) for name, value in zip(NORM_QUANTILES, values)}
    return NormSummary(int(norms.size), quantiles, bool(np.all(np.abs(norms - 1) <= UNIT_NORM_TOLERANCE)))


@dataclass(frozen=True)
class PairNorms:
    """The raw norms of a pair set's images and, per scored pair, the lower of its two images' norms
    with whether the pair is matched (the histogram of the report's `_norms.png`)."""

    images: np.ndarray
    lower: np.ndarray
    issame: np.ndarray

    @classmethod
    def of_pairs(
        cls, norms: np.ndarray, left: np.ndarray, right: np.ndarray, issame: np.ndarray
    ) -> PairNorms:
        norms = np.asarray(norms, dtype=np.float64)
        return cls(norms, np.minimum(norms[left], norms[right]), np.asarray(issame, dtype=bool))

    def summary(self) -> NormSummary:
        return summarize_norms(self.images)
