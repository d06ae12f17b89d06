"""Pixel pipelines against plain NumPy references: normalization, resizing, flip and the optional augments."""

from __future__ import annotations

import cv2
import numpy as np
import pytest
import torch

from facetrain.data.config import AugmentConfig
from facetrain.data.transforms import build_eval_transform, build_train_transform, normalize, normalize_hwc
from facetrain.errors import FacetrainError


def reference(image: np.ndarray) -> torch.Tensor:
    """insightface arcface_torch's (x / 255 - 0.5) / 0.5 in float32, as its inference.py computes it; CHW."""
    chw = torch.from_numpy(np.ascontiguousarray(image.transpose(2, 0, 1))).float()
    return chw.div(255).sub(0.5).div(0.5).double()


@pytest.fixture
def image() -> np.ndarray:
    return np.random.default_rng(0).integers(0, 256, (14, 10, 3), dtype=np.uint8)


def test_normalization_matches_the_reference_exactly(image):
    fused = normalize_hwc(image)
    assert fused.dtype == torch.float32 and fused.shape == (3, 14, 10) and fused.is_contiguous()
    torch.testing.assert_close(fused.double(), reference(image), rtol=0, atol=0)
    chw = torch.from_numpy(np.ascontiguousarray(image.transpose(2, 0, 1)))
    assert torch.equal(normalize(chw), fused)


def test_eval_transform_resizes_only_when_needed(image):
    torch.testing.assert_close(
        build_eval_transform([14, 10])(image).double(), reference(image), rtol=0, atol=0
    )
    shrunk = build_eval_transform([7, 5])(image)
    expected = cv2.resize(image, (5, 7), interpolation=cv2.INTER_AREA)
    torch.testing.assert_close(shrunk.double(), reference(expected), rtol=0, atol=0)
    grown = build_eval_transform([28, 20])(image)
    expected = cv2.resize(image, (20, 28), interpolation=cv2.INTER_LINEAR)
    torch.testing.assert_close(grown.double(), reference(expected), rtol=0, atol=0)


def test_train_flip_is_a_fair_coin_between_the_image_and_its_mirror(image):
    transform = build_train_transform([14, 10], AugmentConfig(horizontal_flip=True))
    plain, mirrored = reference(image).float(), reference(image[:, ::-1]).float()
    torch.manual_seed(0)
    outcomes = []
    for _ in range(200):
        out = transform(image)
        assert torch.equal(out, plain) or torch.equal(out, mirrored)
        outcomes.append(torch.equal(out, mirrored))
    assert 60 <= sum(outcomes) <= 140
    torch.manual_seed(0)
    assert [torch.equal(transform(image), mirrored) for _ in range(200)] == outcomes


def test_train_without_augmentation_is_the_eval_pipeline(image):
    transform = build_train_transform([7, 5], AugmentConfig(horizontal_flip=False))
    assert torch.equal(transform(image), build_eval_transform([7, 5])(image))


def test_crop_and_colour_jitter_keep_shape_and_range_and_follow_the_seed(image):
    augment = AugmentConfig(
        horizontal_flip=True, random_resized_crop=True, crop_scale=[0.5, 1.0], color_jitter=0.4
    )
    transform = build_train_transform([8, 6], augment)
    torch.manual_seed(3)
    first = [transform(image) for _ in range(5)]
    torch.manual_seed(3)
    second = [transform(image) for _ in range(5)]
    for a, b in zip(first, second):
        assert a.shape == (3, 8, 6) and a.dtype == torch.float32
        assert torch.equal(a, b) and -1.0 <= a.min() and a.max() <= 1.0
    assert not all(torch.equal(first[0], other) for other in first[1:])


@pytest.mark.parametrize(
    "size, augment, message",
    [
        ([112], AugmentConfig(), "data.image_size"),
        ([112, 0], AugmentConfig(), "data.image_size"),
        ([112, 112], AugmentConfig(random_resized_crop=True, crop_scale=[0.9, 0.5]), "crop_scale"),
        ([112, 112], AugmentConfig(color_jitter=-0.1), "color_jitter"),
    ],
)
def test_bad_settings_name_the_config_key(size, augment, message):
    with pytest.raises(FacetrainError, match=message):
        build_train_transform(size, augment)
