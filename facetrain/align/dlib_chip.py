"""dlib's face chips: what `dlib.get_face_chip(image, shape, 150, 0.25)` cuts for its face ResNet.

dlib aligns with its 5-point shape predictor (outer and inner corner of each eye, base of the nose)
onto five reference positions given in a unit square around the face; `padding` widens that square
by its fraction on every side, so the chip of `size` pixels holds the positions
(padding + p) / (2 padding + 1) * size. The similarity from the chip onto the photo is fitted to the
five pairs by least squares (Umeyama), as dlib's `find_similarity_transform` does.

dlib then samples the chip as a rectangle of size * scale pixels centred on where the chip's centre
falls, rotated by the similarity's angle, with the chip's first and last pixels on the rectangle's
corners (`get_mapping_to_chip`): one pixel step in the chip is size / (size - 1) of the fitted
scale. `dlib_chip_matrix` reproduces that mapping, so chips cut here line up with dlib's own.
"""

from __future__ import annotations

import numpy as np

from facetrain.align.detectors import FaceBox
from facetrain.align.dlib_models import import_dlib, model_file
from facetrain.align.transform import similarity_transform
from facetrain.errors import FacetrainError

SHAPE_MODEL_5 = "shape_predictor_5_face_landmarks.dat"
DLIB_CHIP_SIZE = (150, 150)
DLIB_CHIP_PADDING = 0.25
# dlib's reference positions of its five landmarks in the unit face square (get_face_chip_details).
DLIB_FIVE_POINT_TEMPLATE = np.array(
    [
        [0.8595674595992, 0.2134981538014],
        [0.6460604764104, 0.2289674387677],
        [0.1205750620789, 0.2137274526848],
        [0.3340850613712, 0.2290642403242],
        [0.4901123135679, 0.6277975316475],
    ],
    dtype=np.float64,
)


class DlibFivePointLandmarks:
    """`landmarks(rgb_image, face) -> (5, 2)` x, y of dlib's 5-point predictor, in its part order."""

    def __init__(self):
        self._dlib = import_dlib()
        self._predictor = self._dlib.shape_predictor(str(model_file(SHAPE_MODEL_5)))

    def __call__(self, image: np.ndarray, face: FaceBox) -> np.ndarray:
        rectangle = self._dlib.rectangle(face.left, face.top, face.right, face.bottom)
        shape = self._predictor(image, rectangle)
        return np.array([(shape.part(index).x, shape.part(index).y) for index in range(5)], dtype=np.float64)


def dlib_chip_points(size: tuple[int, int], padding: float = DLIB_CHIP_PADDING) -> np.ndarray:
    """The (5, 2) positions of dlib's landmarks in a square chip of `size` = (side, side)."""
    side = _square_side(size)
    return (padding + DLIB_FIVE_POINT_TEMPLATE) / (2 * padding + 1) * side


def dlib_chip_matrix(
    landmarks: np.ndarray, size: tuple[int, int], padding: float = DLIB_CHIP_PADDING
) -> np.ndarray:
    """The 2x3 matrix from photo to chip pixels that dlib's `extract_image_chip` samples with."""
    side = _square_side(size)
    chip_to_photo = similarity_transform(dlib_chip_points(size, padding), landmarks)
    linear = chip_to_photo[:, :2]
    centre = linear @ np.array([side / 2, side / 2]) + chip_to_photo[:, 2]
    # the chip's pixels 0 .. side - 1 span the whole side * scale rectangle
    step = linear * side / (side - 1)
    to_chip = np.linalg.inv(step)
    return np.hstack([to_chip, ((side - 1) / 2 - to_chip @ centre)[:, None]])


def _square_side(size: tuple[int, int]) -> int:
    if size[0] != size[1]:
        raise FacetrainError(
            f"--size {size[0]}x{size[1]}: dlib's face chips are square; pass one number, e.g. --size 150"
        )
    return int(size[0])
