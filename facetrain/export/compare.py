"""Comparing two face images with a model: cosine similarity, and a decision at a threshold."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from facetrain.errors import FacetrainError
from facetrain.eval.embedding import embed_images
from facetrain.export.loading import LoadedModel


@dataclass(frozen=True)
class Comparison:
    similarity: float
    threshold: float

    @property
    def same(self) -> bool:
        """Verification accepts a pair whose similarity reaches the threshold."""
        return self.similarity >= self.threshold


def default_flip(card: dict[str, Any]) -> bool:
    """Whether the model was evaluated with the flip test; its threshold only holds under the same.

    The evaluation's own record wins over the training config's `eval.flip`; the flip test is on
    when neither says.
    """
    verification = (card.get("evaluation") or {}).get("verification") or {}
    if "flip" in verification:
        return bool(verification["flip"])
    evaluation_config = ((card.get("training") or {}).get("config") or {}).get("eval") or {}
    return bool(evaluation_config.get("flip", True))


def compare_images(
    model: LoadedModel, first: Path, second: Path, threshold: float | None = None, flip: bool | None = None
) -> Comparison:
    """The cosine similarity of two images, judged at `threshold` or else the card's threshold."""
    threshold = model.threshold if threshold is None else threshold
    if threshold is None:
        raise FacetrainError(
            f"model {model.source} has no verification threshold; pass --threshold T, "
            "or evaluate the checkpoint (facetrain eval) and export it again"
        )
    flip = default_flip(model.card) if flip is None else flip
    vectors = embed_images(model.module, [first, second], model.image_size, flip=flip, progress=False)
    similarity = float(np.dot(vectors[0], vectors[1]))
    return Comparison(similarity, float(threshold))
