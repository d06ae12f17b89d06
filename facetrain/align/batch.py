"""Aligning a list of photos in memory, for commands that embed them straight away."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

import numpy as np

from facetrain.align.aligner import FaceAligner
from facetrain.data.decode import BadImageError, decode_image
from facetrain.progress import ProgressBar


class AlignedBatch(NamedTuple):
    """The paths with a face and their aligned crops (same order), the paths without a face, and why
    each photo that could not be read was left out."""

    kept: list[Path]
    crops: list[np.ndarray]
    faceless: list[Path]
    unreadable: list[str]


def align_images(aligner: FaceAligner, paths: Sequence[Path], progress: bool = True) -> AlignedBatch:
    """Align every photo; one that cannot be read is left out (and named) rather than stopping the rest."""
    batch = AlignedBatch([], [], [], [])
    for path in ProgressBar(paths, desc="align", unit="img", disable=not progress or len(paths) < 2):
        try:
            aligned = aligner.align(decode_image(path))
        except BadImageError as error:
            batch.unreadable.append(str(error))
            continue
        if aligned is None:
            batch.faceless.append(path)
        else:
            batch.kept.append(path)
            batch.crops.append(aligned.crop)
    return batch
