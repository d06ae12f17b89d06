"""`facetrain embed`'s work: image files in, one embedding a readable image out.

A batch of thousands of files is not stopped by one of them: a file that cannot be read (corrupt,
not an image, over the pixel limit) or, with an aligner, a photo without a face is left out and
named, and the rest are embedded. Only when nothing is left is it an error.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from facetrain.align.aligner import FaceAligner
from facetrain.align.batch import align_images
from facetrain.data.decode import left_out_warnings
from facetrain.errors import FacetrainError
from facetrain.eval.embedding import EmbedSettings, compute_embeddings
from facetrain.interop.loading import LoadedModel


@dataclass(frozen=True)
class EmbeddedPaths:
    """`vectors[k]` is the embedding of `paths[k]`, `norms[k]` its raw norm; `unreadable` says why each
    file left out was."""

    paths: list[Path]
    vectors: np.ndarray
    unreadable: list[str]
    faceless: list[Path]
    norms: np.ndarray

    def warnings(self) -> list[str]:
        lines = left_out_warnings(self.unreadable)
        if self.faceless:
            lines.append(f"left out {len(self.faceless)} images without a face, e.g. {self.faceless[0]}")
        return lines

    def left_out(self) -> str:
        """What the summary line adds about the files left out, or nothing."""
        if not self.unreadable:
            return ""
        count = len(self.unreadable)
        return f"; left out {count} unreadable image{'s' if count > 1 else ''}"


def embed_paths(
    model: LoadedModel,
    images: Sequence[Path],
    batch_size: int,
    flip: bool,
    aligner: FaceAligner | None = None,
) -> EmbeddedPaths:
    """Embed the image files `images`, aligning each photo first when there is an `aligner`."""
    paths, inputs, faceless, unreadable = list(images), list(images), [], []
    if aligner is not None:
        paths, inputs, faceless, unreadable = align_images(aligner, images)
        if not paths:
            raise FacetrainError(
                _nothing_left(unreadable, f"no face found in any of the {len(images)} images")
            )
    settings = EmbedSettings(model.image_size, batch_size, flip)
    result = compute_embeddings(model.module, inputs, settings, skip_unreadable=True)
    if result.unreadable:
        unreadable += list(result.unreadable.values())
        paths = [path for position, path in enumerate(paths) if position not in result.unreadable]
    if not paths:
        raise FacetrainError(_nothing_left(unreadable, f"none of the {len(images)} images could be read"))
    return EmbeddedPaths(paths, result.vectors, unreadable, faceless, result.norms)


def _nothing_left(unreadable: list[str], reason: str) -> str:
    first = f" (first: {unreadable[0]})" if unreadable else ""
    return f"{reason}{first}; nothing to embed"
