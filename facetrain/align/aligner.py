"""Aligning one image: the largest face, its five landmarks, and the warp onto the template."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from facetrain.align.detectors import FACE_DETECTORS, find_faces
from facetrain.align.template import TEMPLATES
from facetrain.align.transform import warp_to_template
from facetrain.data.decode import decode_image
from facetrain.errors import FacetrainError

DEFAULT_SIZE = (112, 112)
DEFAULT_DETECTOR = "hog"
DEFAULT_TEMPLATE = "arcface"


@dataclass(frozen=True)
class AlignedFace:
    """The crop (RGB uint8), the five landmarks found in the source image, and how many faces it had."""

    crop: np.ndarray
    landmarks: np.ndarray
    faces: int


class FaceAligner:
    """Finds and aligns faces to crops of `size` = (height, width) (None: the template's own size);
    build once, use for many images."""

    def __init__(
        self,
        size: tuple[int, int] | None = DEFAULT_SIZE,
        detector: str = DEFAULT_DETECTOR,
        template: str = DEFAULT_TEMPLATE,
    ):
        self._template = TEMPLATES.build(template)
        size = size or self._template.default_size
        self.size = (int(size[0]), int(size[1]))
        self.template = self._template.reference_points(self.size)
        self._detect = FACE_DETECTORS.build(detector)
        self._landmarks = self._template.landmarks()

    def landmarks(self, image: np.ndarray) -> tuple[np.ndarray | None, int]:
        """The five landmarks of the largest face in an RGB image (None without a face), and the face count."""
        faces = find_faces(self._detect, np.ascontiguousarray(image))
        if not faces:
            return None, 0
        return self._landmarks(image, faces[0]), len(faces)

    def align(self, image: np.ndarray) -> AlignedFace | None:
        """The aligned crop of the largest face, or None when no face is found."""
        landmarks, faces = self.landmarks(image)
        if landmarks is None:
            return None
        matrix = self._template.matrix(landmarks, self.size)
        return AlignedFace(warp_to_template(image, matrix, self.size), landmarks, faces)

    def align_file_or_fail(self, path: str | Path) -> np.ndarray:
        """The aligned crop of an image file; a photo without a face is a one-line error naming it."""
        aligned = self.align(decode_image(path))
        if aligned is None:
            raise FacetrainError(
                f"{path}: no face found; pass a photo with a visible face, or an aligned crop without --align"
            )
        return aligned.crop
