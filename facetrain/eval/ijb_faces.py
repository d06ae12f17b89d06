"""IJB's loose crops aligned as insightface's eval_ijbc.py aligns them, one face at a time.

Each photo is mapped onto the ArcFace five-point template by the least-squares similarity transform
of its five detected landmarks (the Umeyama fit skimage's SimilarityTransform makes there) and warped
bilinearly with a black border. A model of another input size gets the template scaled to that size
(`facetrain.align.template.reference_points`). The sequence is lazy and picklable, so DataLoader
workers decode and warp in parallel while the model embeds.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from facetrain.align.template import reference_points
from facetrain.align.transform import similarity_transform, warp_to_template
from facetrain.data.decode import decode_image


class AlignedFaces(Sequence):
    """uint8 RGB crops of `size` = (height, width), from photo paths and their (N, 5, 2) landmarks."""

    def __init__(self, paths: Sequence[str], landmarks: np.ndarray, size: tuple[int, int]):
        if len(paths) != len(landmarks):
            raise ValueError(f"{len(paths)} photos but {len(landmarks)} landmark sets")
        self.paths = paths
        self.landmarks = landmarks
        self.size = (int(size[0]), int(size[1]))
        self.template = reference_points(self.size)

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int) -> np.ndarray:
        photo = decode_image(self.paths[index])
        matrix = similarity_transform(self.landmarks[index], self.template)
        return warp_to_template(photo, matrix, self.size)
