"""Face detectors by name: dlib's HOG detector (the default, fast on a CPU) and its CNN detector.

Each factory returns `detect(rgb_image, upsample) -> list[FaceBox]`. `find_faces` runs it at the
image's own scale and, when that finds nothing in a small image, once more on the image upsampled
by two: dlib's detectors miss faces under about 80 pixels, which is common in face crops.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from facetrain.align.dlib_models import import_dlib, model_file
from facetrain.registry import Registry

CNN_MODEL = "mmod_human_face_detector.dat"
UPSAMPLE_MAX_SIDE = 1000


@dataclass(frozen=True)
class FaceBox:
    left: int
    top: int
    right: int
    bottom: int
    score: float

    @property
    def area(self) -> int:
        return max(0, self.right - self.left) * max(0, self.bottom - self.top)


Detect = Callable[[np.ndarray, int], list[FaceBox]]
FACE_DETECTORS: Registry[Detect] = Registry("face detector")


def _box(rectangle, score: float) -> FaceBox:
    return FaceBox(rectangle.left(), rectangle.top(), rectangle.right(), rectangle.bottom(), float(score))


@FACE_DETECTORS.register("hog")
def hog_detector() -> Detect:
    """Histogram-of-gradients + linear SVM: frontal and slightly turned faces, milliseconds per photo."""
    detector = import_dlib().get_frontal_face_detector()

    def detect(image: np.ndarray, upsample: int) -> list[FaceBox]:
        rectangles, scores, _ = detector.run(image, upsample)
        return [_box(rectangle, score) for rectangle, score in zip(rectangles, scores)]

    return detect


@FACE_DETECTORS.register("cnn")
def cnn_detector() -> Detect:
    """dlib's max-margin CNN: finds more turned and small faces, but is far slower without a GPU."""
    network = import_dlib().cnn_face_detection_model_v1(str(model_file(CNN_MODEL)))

    def detect(image: np.ndarray, upsample: int) -> list[FaceBox]:
        return [_box(found.rect, found.confidence) for found in network(image, upsample)]

    return detect


def find_faces(detect: Detect, image: np.ndarray) -> list[FaceBox]:
    """Faces in an RGB image, largest first."""
    faces = detect(image, 0)
    if not faces and max(image.shape[:2]) <= UPSAMPLE_MAX_SIDE:
        faces = detect(image, 1)
    return sorted(faces, key=lambda face: face.area, reverse=True)
