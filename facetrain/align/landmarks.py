"""Five landmarks (eye centres, nose tip, mouth corners) from dlib's 68-point shape predictor.

dlib's own 5-point predictor marks the outer and inner corners of each eye and the base of the
nose, not the points of the ArcFace template, and its two eye corners are not the eye centre. The
68-point predictor (iBUG 300-W markup) gives everything the template needs: the eye centre is the
mean of the six points around each eye (36-41 and 42-47), the nose tip is point 30 and the mouth
corners are points 48 and 54.
"""

from __future__ import annotations

import numpy as np

from facetrain.align.detectors import FaceBox
from facetrain.align.dlib_models import import_dlib, model_file

SHAPE_MODEL = "shape_predictor_68_face_landmarks.dat"
IMAGE_LEFT_EYE = range(36, 42)
IMAGE_RIGHT_EYE = range(42, 48)
NOSE_TIP = 30
MOUTH_LEFT = 48
MOUTH_RIGHT = 54


class FivePointLandmarks:
    """`landmarks(rgb_image, face) -> (5, 2)` x, y in the template's order."""

    def __init__(self):
        self._dlib = import_dlib()
        self._predictor = self._dlib.shape_predictor(str(model_file(SHAPE_MODEL)))

    def __call__(self, image: np.ndarray, face: FaceBox) -> np.ndarray:
        rectangle = self._dlib.rectangle(face.left, face.top, face.right, face.bottom)
        shape = self._predictor(image, rectangle)
        points = np.array(
            [(shape.part(index).x, shape.part(index).y) for index in range(68)], dtype=np.float64
        )
        return np.stack(
            [
                points[IMAGE_LEFT_EYE].mean(axis=0),
                points[IMAGE_RIGHT_EYE].mean(axis=0),
                points[NOSE_TIP],
                points[MOUTH_LEFT],
                points[MOUTH_RIGHT],
            ]
        )
