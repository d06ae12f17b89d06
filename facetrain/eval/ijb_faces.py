"""IJB's loose crops, each aligned by its five landmarks, one face at a time.

How a face is aligned is the caller's (`facetrain eval --ijb` passes `align.five_points.FivePointCrop`,
insightface eval_ijbc.py's alignment), so evaluation stays independent of the alignment code. The
sequence is lazy and picklable, so DataLoader workers decode and align in parallel while the model embeds.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from facetrain.data.decode import decode_image

# a photo (uint8 RGB) and its (5, 2) landmarks -> the aligned uint8 RGB crop
FaceCrop = Callable[[np.ndarray, np.ndarray], np.ndarray]


class AlignedFaces(Sequence):
    """uint8 RGB crops made by `crop` from photo paths and their (N, 5, 2) landmarks."""

    def __init__(self, paths: Sequence[str], landmarks: np.ndarray, crop: FaceCrop):
        if len(paths) != len(landmarks):
            raise ValueError(f"{len(paths)} photos but {len(landmarks)} landmark sets")
        self.paths = paths
        self.landmarks = landmarks
        self.crop = crop

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int) -> np.ndarray:
        return self.crop(decode_image(self.paths[index]), self.landmarks[index])
