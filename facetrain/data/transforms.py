"""Pixel pipelines from decoded RGB arrays to normalized CHW tensors.

The common path (resize when needed, flip, normalize) stays in OpenCV and NumPy on the HWC array, with
normalization and the HWC -> CHW copy fused into one pass: that is about half the per-image cost of
doing the same with tensors and torchvision modules, and this pipeline is what a DataLoader worker
spends its core on. Random resized crop and colour jitter use torchvision transforms v2 on uint8
tensors; the face augmentations of `facetrain/data/augment.py` work on the HWC array. Every random
draw comes from torch's CPU generator, which `FaceDataset` seeds per sample from its `SampleKey`, so
augmentation is a function of the sample's key. Normalization (`facetrain.pixels`) is
(x - 127.5) / 127.5, what insightface's arcface_torch trains and evaluates with, computed in its float32
steps ((x / 255 - 0.5) / 0.5), so its released backbones get bit for bit the inputs they get there;
the exported card records the same constants.
"""

from __future__ import annotations

from collections.abc import Callable

import cv2
import numpy as np
import torch
from torchvision.transforms import v2

from facetrain.config import validate_section
from facetrain.data.augment import GeometricJitter, RandomBlur, RandomGray, random_erasing
from facetrain.data.config import AugmentConfig
from facetrain.errors import FacetrainError
from facetrain.pixels import PIXEL_MAX, PIXEL_MEAN, PIXEL_SCALE

Transform = Callable[[np.ndarray], torch.Tensor]


def _check_size(image_size: tuple[int, int] | list[int]) -> tuple[int, int]:
    if len(image_size) != 2 or min(image_size) < 1:
        raise FacetrainError(
            f"data.image_size must be [height, width] of positive integers, got {image_size}"
        )
    return int(image_size[0]), int(image_size[1])


# How an image of another size is brought to the model's input size. "area" (facetrain's own): area
# interpolation when shrinking, which avoids aliasing, bilinear when enlarging. "linear": bilinear
# always, as insightface's recognition/arcface_torch/inference.py resizes (cv2.resize's default), so a
# model imported from insightface sees what it sees there (cosine 0.9995 between the two on 150x150
# photos, see docs/evaluation.md).
RESIZE_AREA = "area"
RESIZE_LINEAR = "linear"
RESIZE_INTERPOLATIONS = (RESIZE_AREA, RESIZE_LINEAR)


def resize_if_needed(
    image: np.ndarray, height: int, width: int, interpolation: str = RESIZE_AREA
) -> np.ndarray:
    """`image` at (height, width), resized by `interpolation` (RESIZE_AREA or RESIZE_LINEAR)."""
    if image.shape[0] == height and image.shape[1] == width:
        return image
    if interpolation not in RESIZE_INTERPOLATIONS:
        raise FacetrainError(
            f"unknown resize interpolation {interpolation!r}; use one of {', '.join(RESIZE_INTERPOLATIONS)}"
        )
    shrinking = image.shape[0] > height or image.shape[1] > width
    flag = cv2.INTER_AREA if shrinking and interpolation == RESIZE_AREA else cv2.INTER_LINEAR
    return cv2.resize(image, (width, height), interpolation=flag)


def to_chw_uint8(image: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(image.transpose(2, 0, 1)))


def normalize(chw: torch.Tensor) -> torch.Tensor:
    """uint8 CHW -> float32 CHW in [-1, 1]."""
    return chw.to(torch.float32).div_(PIXEL_MAX).sub_(PIXEL_MEAN / PIXEL_MAX).div_(PIXEL_SCALE / PIXEL_MAX)


def normalize_hwc(image: np.ndarray) -> torch.Tensor:
    """uint8 HWC -> float32 CHW in [-1, 1], bit-identical to `normalize`: the same three correctly rounded
    float32 steps (no multiplication by a rounded reciprocal, which would change the last bit)."""
    out = np.empty((image.shape[2], image.shape[0], image.shape[1]), dtype=np.float32)
    np.divide(image.transpose(2, 0, 1), np.float32(PIXEL_MAX), out=out, dtype=np.float32)
    np.subtract(out, np.float32(PIXEL_MEAN / PIXEL_MAX), out=out)
    np.divide(out, np.float32(PIXEL_SCALE / PIXEL_MAX), out=out)
    return torch.from_numpy(out)


class EvalTransform:
    """Resize (when needed, by `interpolation`) and normalize; picklable so DataLoader workers can
    receive it."""

    def __init__(self, image_size: tuple[int, int] | list[int], interpolation: str = RESIZE_AREA):
        self.height, self.width = _check_size(image_size)
        self.interpolation = interpolation

    def __call__(self, image: np.ndarray) -> torch.Tensor:
        return normalize_hwc(resize_if_needed(image, self.height, self.width, self.interpolation))


class TrainTransform:
    """Eval pipeline plus the augmentations `data.augment` turns on, in a fixed order.

    Flip, then the random resized crop or the plain resize, so that everything after works at the
    output size (blur sigmas are in its pixels); then geometric jitter, grey and blur on the HWC array,
    colour jitter on the uint8 tensor, and random erasing on the normalized one.
    """

    def __init__(self, image_size: tuple[int, int] | list[int], augment: AugmentConfig):
        self.height, self.width = _check_size(image_size)
        validate_section(augment, "data.augment.")
        self.horizontal_flip = augment.horizontal_flip
        self.crop = None
        if augment.random_resized_crop:
            scale = (float(augment.crop_scale[0]), float(augment.crop_scale[1]))
            self.crop = v2.RandomResizedCrop((self.height, self.width), scale=scale, antialias=True)
        self.pixel_steps: list[Callable[[np.ndarray], np.ndarray]] = []
        if augment.rotation > 0 or augment.shift > 0 or augment.scale != [1.0, 1.0]:
            self.pixel_steps.append(GeometricJitter(augment.rotation, augment.shift, augment.scale))
        if augment.grayscale > 0:
            self.pixel_steps.append(RandomGray(augment.grayscale))
        if augment.blur > 0:
            self.pixel_steps.append(RandomBlur(augment.blur, augment.blur_sigma))
        self.color_jitter = None
        if augment.color_jitter > 0:
            strength = augment.color_jitter
            self.color_jitter = v2.ColorJitter(brightness=strength, contrast=strength, saturation=strength)
        self.erasing = (
            random_erasing(augment.random_erasing, augment.erasing_area) if augment.random_erasing else None
        )

    def __call__(self, image: np.ndarray) -> torch.Tensor:
        if self.horizontal_flip and torch.rand(()).item() < 0.5:
            image = cv2.flip(image, 1)
        if self.crop is None:
            image = resize_if_needed(image, self.height, self.width)
        else:
            image = self.crop(to_chw_uint8(image)).permute(1, 2, 0).numpy()
        for step in self.pixel_steps:
            image = step(image)
        if self.color_jitter is None:
            tensor = normalize_hwc(image)
        else:
            tensor = normalize(self.color_jitter(to_chw_uint8(image)))
        return tensor if self.erasing is None else self.erasing(tensor)


def build_eval_transform(
    image_size: tuple[int, int] | list[int], interpolation: str = RESIZE_AREA
) -> Transform:
    return EvalTransform(image_size, interpolation)


def build_train_transform(image_size: tuple[int, int] | list[int], augment: AugmentConfig) -> Transform:
    return TrainTransform(image_size, augment)
