"""Comparing two face images with a model: cosine similarity, and a decision at a threshold."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from facetrain.data.decode import decode_image
from facetrain.errors import FacetrainError
from facetrain.eval.embedding import EmbedSettings, embed_images
from facetrain.interop.loading import LoadedModel

if TYPE_CHECKING:
    from facetrain.align.aligner import FaceAligner


@dataclass(frozen=True)
class Comparison:
    """`threshold_far` is the false-accept rate the card's threshold gave in evaluation (None when the
    threshold was given by hand or the card does not record it)."""

    similarity: float
    threshold: float
    threshold_far: float | None = None

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
    model: LoadedModel,
    first: Path,
    second: Path,
    threshold: float | None = None,
    flip: bool | None = None,
    aligner: FaceAligner | None = None,
) -> Comparison:
    """The cosine similarity of two images, judged at `threshold` or else the card's threshold.

    With an `aligner`, faces are found in the two photos and aligned to the model's input first.
    """
    threshold_far = None
    if threshold is None:
        threshold, threshold_far = model.threshold, model.card.get("threshold_far")
    if threshold is None:
        raise FacetrainError(
            f"model {model.source} has no verification threshold; pass --threshold T, "
            "or evaluate the checkpoint (facetrain eval) and export it again"
        )
    flip = default_flip(model.card) if flip is None else flip
    images = [first, second]
    if aligner is not None:
        images = [aligner.align_file_or_fail(path) for path in images]
    vectors = embed_images(model.module, images, EmbedSettings(model.image_size, flip=flip, progress=False))
    similarity = float(np.dot(vectors[0], vectors[1]))
    return Comparison(similarity, float(threshold), None if threshold_far is None else float(threshold_far))


def unaligned_hint(paths: list[Path], image_size: tuple[int, int]) -> str | None:
    """A note when an image is not the model's input size (height x width), so likely not a crop that
    `facetrain align` made: the model was trained on aligned faces and scores raw photos poorly."""
    for path in paths:
        height, width = decode_image(path).shape[:2]
        if (height, width) != tuple(image_size):
            return (
                f"note: {path} is {width}x{height}, not the model's {image_size[1]}x{image_size[0]} input: the "
                "model expects aligned face crops, so a raw photo scores low; add --align to find and align "
                "the faces first"
            )
    return None
