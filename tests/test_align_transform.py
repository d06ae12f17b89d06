"""The similarity fit, the template and the crops, against plain references (no dlib needed)."""

from __future__ import annotations

import cv2
import numpy as np
import pytest

from facetrain.align.template import ARCFACE_TEMPLATE_112, parse_crop_size, reference_points
from facetrain.align.transform import center_crop, similarity_transform, warp_to_template
from facetrain.errors import FacetrainError

# The older SphereFace/CosFace 112x96 template, as published with those models.
SPHEREFACE_TEMPLATE_112X96 = np.array(
    [[30.2946, 51.6963], [65.5318, 51.5014], [48.0252, 71.7366], [33.5493, 92.3655], [62.7299, 92.2041]]
)


def least_squares_similarity(source: np.ndarray, target: np.ndarray) -> np.ndarray:
    """x' = a x - b y + tx, y' = b x + a y + ty solved as a plain linear least-squares problem."""
    rows, values = [], []
    for (x, y), (u, v) in zip(source, target):
        rows += [[x, -y, 1, 0], [y, x, 0, 1]]
        values += [u, v]
    a, b, tx, ty = np.linalg.lstsq(np.array(rows), np.array(values), rcond=None)[0]
    return np.array([[a, -b, tx], [b, a, ty]])


def apply(matrix: np.ndarray, points: np.ndarray) -> np.ndarray:
    return points @ matrix[:, :2].T + matrix[:, 2]


def test_an_exact_similarity_is_recovered():
    angle, scale, shift = 0.3, 1.7, np.array([12.0, -5.0])
    rotation = np.array([[np.cos(angle), -np.sin(angle)], [np.sin(angle), np.cos(angle)]])
    source = np.random.default_rng(0).uniform(0, 200, (5, 2))
    target = scale * source @ rotation.T + shift
    np.testing.assert_allclose(
        similarity_transform(source, target), np.c_[scale * rotation, shift], atol=1e-9
    )


@pytest.mark.parametrize("seed", range(5))
def test_noisy_landmarks_fit_like_plain_least_squares_and_opencv(seed: int):
    rng = np.random.default_rng(seed)
    source = ARCFACE_TEMPLATE_112 * rng.uniform(0.8, 2.5) + rng.uniform(0, 100, 2) + rng.normal(0, 3, (5, 2))
    ours = similarity_transform(source, ARCFACE_TEMPLATE_112)
    np.testing.assert_allclose(ours, least_squares_similarity(source, ARCFACE_TEMPLATE_112), atol=1e-8)
    opencv, _ = cv2.estimateAffinePartial2D(
        source, ARCFACE_TEMPLATE_112, method=cv2.RANSAC, ransacReprojThreshold=1e6, refineIters=100
    )
    np.testing.assert_allclose(ours, opencv, atol=1e-4)


def test_a_mirrored_face_is_not_reflected():
    mirrored = ARCFACE_TEMPLATE_112 * [-1, 1]
    matrix = similarity_transform(mirrored, ARCFACE_TEMPLATE_112)
    assert np.linalg.det(matrix[:, :2]) > 0


def test_templates_for_other_sizes():
    np.testing.assert_allclose(reference_points((112, 112)), ARCFACE_TEMPLATE_112)
    np.testing.assert_allclose(reference_points((112, 96)), SPHEREFACE_TEMPLATE_112X96, atol=1e-9)
    np.testing.assert_allclose(reference_points((224, 224)), 2 * ARCFACE_TEMPLATE_112)
    assert parse_crop_size("112") == (112, 112) and parse_crop_size("112x96") == (112, 96)
    for bad in ("", "big", "112x", "8", "112x96x3"):
        with pytest.raises(FacetrainError, match="--size"):
            parse_crop_size(bad)


def test_warp_puts_landmarks_on_the_template():
    image = np.zeros((300, 400, 3), np.uint8)
    landmarks = ARCFACE_TEMPLATE_112 * 2.2 + [120, 40]
    for x, y in landmarks.round().astype(int):
        image[y - 1 : y + 2, x - 1 : x + 2] = 255
    crop = warp_to_template(image, similarity_transform(landmarks, ARCFACE_TEMPLATE_112), (112, 112))
    assert crop.shape == (112, 112, 3)
    for x, y in ARCFACE_TEMPLATE_112:
        assert crop[int(round(y)), int(round(x))].max() > 100


def test_center_crop_keeps_the_middle_at_the_crop_aspect():
    image = np.zeros((250, 250, 3), np.uint8)
    image[:, :125] = 200
    crop = center_crop(image, (112, 96))
    assert crop.shape == (112, 96, 3)
    assert crop[:, :40].min() > 150 and crop[:, 56:].max() < 50
