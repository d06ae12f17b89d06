"""The five reference points of aligned face crops, and crop sizes.

The ArcFace template is the one insightface aligns MS1M, Glint360K and its evaluation sets to:
eye centres, nose tip and mouth corners in a 112x112 crop, in image order (the left eye in the
picture first). The older 112x96 crop of SphereFace and CosFace is the same face 8 pixels further
left; other sizes scale the 112-pixel height and centre the face horizontally, which reproduces
both.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from facetrain.align import dlib_chip
from facetrain.align.landmarks import FivePointLandmarks
from facetrain.align.transform import similarity_transform
from facetrain.errors import FacetrainError
from facetrain.registry import Registry

TEMPLATE_HEIGHT = 112
SMALLEST_CROP = 16
LARGEST_CROP = 4096
ARCFACE_TEMPLATE_112 = np.array(
    [
        [38.2946, 51.6963],
        [73.5318, 51.5014],
        [56.0252, 71.7366],
        [41.5493, 92.3655],
        [70.7299, 92.2041],
    ],
    dtype=np.float64,
)
LANDMARK_NAMES = ("left_eye", "right_eye", "nose", "mouth_left", "mouth_right")


def reference_points(size: tuple[int, int]) -> np.ndarray:
    """The (5, 2) x, y template for a crop of `size` = (height, width)."""
    height, width = size
    scale = height / TEMPLATE_HEIGHT
    points = ARCFACE_TEMPLATE_112 * scale
    points[:, 0] += (width - TEMPLATE_HEIGHT * scale) / 2
    return points


def parse_crop_size(text: str) -> tuple[int, int]:
    """`112` (square) or `HEIGHTxWIDTH` such as `112x96`; each side at most LARGEST_CROP, as a crop of
    100000x100000 would take 30 GB for every face."""
    parts = text.lower().split("x")
    if len(parts) in (1, 2) and all(
        part.strip().isdigit() and SMALLEST_CROP <= int(part) <= LARGEST_CROP for part in parts
    ):
        height = int(parts[0])
        return height, int(parts[-1])
    raise FacetrainError(
        f"--size {text!r}: give one number for a square crop (112) or HEIGHTxWIDTH (112x96), each from "
        f"{SMALLEST_CROP} to {LARGEST_CROP}"
    )


@dataclass(frozen=True)
class AlignmentTemplate:
    """What `facetrain align --template` names: the landmarks a face is found by, where they go in a
    crop of a given size, the 2x3 photo-to-crop matrix, and the crop size models of that kind take."""

    default_size: tuple[int, int]
    landmarks: Callable[[], Callable]
    reference_points: Callable[[tuple[int, int]], np.ndarray]
    matrix: Callable[[np.ndarray, tuple[int, int]], np.ndarray]


def _arcface() -> AlignmentTemplate:
    return AlignmentTemplate(
        (TEMPLATE_HEIGHT, TEMPLATE_HEIGHT),
        FivePointLandmarks,
        reference_points,
        lambda landmarks, size: similarity_transform(landmarks, reference_points(size)),
    )


def _dlib() -> AlignmentTemplate:
    """dlib's `get_face_chip(image, shape, 150, 0.25)`, the chips its face ResNet was trained on."""
    return AlignmentTemplate(
        dlib_chip.DLIB_CHIP_SIZE,
        dlib_chip.DlibFivePointLandmarks,
        dlib_chip.dlib_chip_points,
        dlib_chip.dlib_chip_matrix,
    )


TEMPLATES: Registry[AlignmentTemplate] = Registry("alignment template")
TEMPLATES.register("arcface")(_arcface)
TEMPLATES.register("dlib")(_dlib)
