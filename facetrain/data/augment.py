"""Face augmentations for small real sets: geometric jitter, grey, blur and random erasing.

With a few images per identity a network memorises pixels: where the face sits in the crop, its
exact tilt, the lighting. These augmentations vary what does not identify a person (docs/accuracy.md
measures each). Every random draw comes from torch's CPU generator, which `FaceDataset` seeds per
sample, so an image's augmentation depends only on its sample key and exact resume keeps working.

The geometric jitter runs in OpenCV on the HWC array with mirrored borders: torchvision's affine
fills the uncovered border with a constant, an edge no evaluation image has. Grey uses the same luma
weights (ITU-R 601) as decoding a greyscale file into three channels, so a colour image turned grey
looks like a greyscale photo (such as ORL's) does to the model, in training and in evaluation.
"""

from __future__ import annotations

import math

import cv2
import numpy as np
import torch
from torchvision.transforms import v2


def uniform(low: float, high: float) -> float:
    """One draw in [low, high) from torch's CPU generator (the per-sample stream)."""
    return low + (high - low) * torch.rand(()).item()


class GeometricJitter:
    """A random similarity transform about the centre: rotation, zoom, then a shift."""

    def __init__(self, rotation: float, shift: float, scale: tuple[float, float]):
        self.rotation, self.shift = float(rotation), float(shift)
        self.scale = (float(scale[0]), float(scale[1]))

    def __call__(self, image: np.ndarray) -> np.ndarray:
        height, width = image.shape[:2]
        angle = uniform(-self.rotation, self.rotation)
        zoom = uniform(*self.scale)
        shift_x = uniform(-self.shift, self.shift) * width
        shift_y = uniform(-self.shift, self.shift) * height
        matrix = cv2.getRotationMatrix2D(((width - 1) / 2, (height - 1) / 2), angle, zoom)
        matrix[:, 2] += (shift_x, shift_y)
        return cv2.warpAffine(
            image, matrix, (width, height), flags=cv2.INTER_LINEAR, borderMode=cv2.BORDER_REFLECT_101
        )


class RandomGray:
    """With probability `p`, the image's luma in all three channels."""

    def __init__(self, p: float):
        self.p = float(p)

    def __call__(self, image: np.ndarray) -> np.ndarray:
        if torch.rand(()).item() >= self.p:
            return image
        return cv2.cvtColor(cv2.cvtColor(image, cv2.COLOR_RGB2GRAY), cv2.COLOR_GRAY2RGB)


class RandomBlur:
    """With probability `p`, a Gaussian blur with sigma drawn from `sigma` (pixels of the output size)."""

    def __init__(self, p: float, sigma: tuple[float, float]):
        self.p = float(p)
        self.sigma = (float(sigma[0]), float(sigma[1]))

    def __call__(self, image: np.ndarray) -> np.ndarray:
        if torch.rand(()).item() >= self.p:
            return image
        sigma = uniform(*self.sigma)
        size = 2 * math.ceil(3 * sigma) + 1
        return cv2.GaussianBlur(image, (size, size), sigma, borderType=cv2.BORDER_REFLECT_101)


def random_erasing(p: float, area: tuple[float, float]) -> v2.RandomErasing:
    """Blank a random rectangle (aspect 0.3 to 3.3) with 0, the mean grey, on the normalized tensor:
    the model must not rely on any one part of the face, as with an occluding hand or sunglasses."""
    return v2.RandomErasing(p=float(p), scale=(float(area[0]), float(area[1])), value=0.0)
