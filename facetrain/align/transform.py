"""The similarity transform onto the template and the warps that produce crops.

A similarity (rotation, uniform scale, translation) keeps the face's proportions, which is what
insightface's alignment does; an affine fit to five points would also shear faces towards the
template and erase some of what tells people apart.
"""

from __future__ import annotations

import cv2
import numpy as np


def similarity_transform(source: np.ndarray, target: np.ndarray) -> np.ndarray:
    """The 2x3 matrix of the least-squares similarity mapping `source` points onto `target` points.

    Umeyama's closed form (IEEE PAMI 13(4), 1991): the rotation comes from the SVD of the
    cross-covariance, with the sign fix that rules out a reflection, then the scale and shift.
    """
    source = np.asarray(source, dtype=np.float64)
    target = np.asarray(target, dtype=np.float64)
    source_mean, target_mean = source.mean(axis=0), target.mean(axis=0)
    source_centred, target_centred = source - source_mean, target - target_mean
    covariance = target_centred.T @ source_centred / len(source)
    left, singular, right = np.linalg.svd(covariance)
    signs = np.array([1.0, np.sign(np.linalg.det(left) * np.linalg.det(right)) or 1.0])
    rotation = left @ np.diag(signs) @ right
    scale = float((singular * signs).sum() / source_centred.var(axis=0).sum())
    shift = target_mean - scale * rotation @ source_mean
    return np.hstack([scale * rotation, shift[:, None]])


def warp_to_template(image: np.ndarray, matrix: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """The (height, width) crop seen through `matrix`; what falls outside the photo is black."""
    height, width = size
    return cv2.warpAffine(image, matrix, (width, height), flags=cv2.INTER_LINEAR, borderValue=0)


def center_crop(image: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """The largest centred region of the crop's aspect ratio, resized to (height, width)."""
    height, width = size
    image_height, image_width = image.shape[:2]
    scale = min(image_height / height, image_width / width)
    crop_height, crop_width = round(height * scale), round(width * scale)
    top, left = (image_height - crop_height) // 2, (image_width - crop_width) // 2
    region = image[top : top + crop_height, left : left + crop_width]
    shrinking = crop_height > height
    return cv2.resize(
        region, (width, height), interpolation=cv2.INTER_AREA if shrinking else cv2.INTER_LINEAR
    )
