"""A face cropped by its five given landmarks, as insightface's eval_ijbc.py crops IJB's loose photos.

The landmarks are the least-squares similarity transform's source (the Umeyama fit skimage's
SimilarityTransform makes there), the ArcFace template scaled to the crop's size its target
(`template.reference_points`); the photo is warped bilinearly with a black border. The object is
picklable, so DataLoader workers crop in parallel; `facetrain eval --ijb` hands it to the IJB protocol.
"""

from __future__ import annotations

import numpy as np

from facetrain.align.template import reference_points
from facetrain.align.transform import similarity_transform, warp_to_template


class FivePointCrop:
    """photo (uint8 RGB) and its (5, 2) landmarks -> the aligned crop of `size` = (height, width)."""

    def __init__(self, size: tuple[int, int]):
        self.size = (int(size[0]), int(size[1]))
        self.template = reference_points(self.size)

    def __call__(self, photo: np.ndarray, landmarks: np.ndarray) -> np.ndarray:
        return warp_to_template(photo, similarity_transform(landmarks, self.template), self.size)
