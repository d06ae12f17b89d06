"""Aligning a list of photos in memory, for commands that embed them straight away."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from facetrain.align.aligner import FaceAligner
from facetrain.data.decode import decode_image
from facetrain.progress import ProgressBar


def align_images(
    aligner: FaceAligner, paths: Sequence[Path], progress: bool = True
) -> tuple[list[Path], list[np.ndarray], list[Path]]:
    """The paths with a face and their aligned crops (same order), and the paths without a face."""
    kept, crops, faceless = [], [], []
    for path in ProgressBar(paths, desc="align", unit="img", disable=not progress or len(paths) < 2):
        aligned = aligner.align(decode_image(path))
        if aligned is None:
            faceless.append(path)
        else:
            kept.append(path)
            crops.append(aligned.crop)
    return kept, crops, faceless
