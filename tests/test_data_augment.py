"""Face augmentations against plain references (SciPy's affine sampling and Gaussian filter, the ITU-R 601
luma), their probabilities, and the per-sample seed that exact resume relies on."""

from __future__ import annotations

import math

import cv2
import numpy as np
import pytest
import torch
from scipy import ndimage

from facetrain.data.augment import GeometricJitter, RandomBlur, RandomGray, random_erasing
from facetrain.data.config import AugmentConfig
from facetrain.data.decode import decode_image
from facetrain.data.transforms import build_eval_transform, build_train_transform


def smooth_image(height=48, width=40, seed=0) -> np.ndarray:
    """Low-frequency colour content, so bilinear samplers agree to rounding away from the border."""
    noise = np.random.default_rng(seed).normal(size=(height // 8 + 2, width // 8 + 2, 3))
    large = cv2.resize(noise, (width, height), interpolation=cv2.INTER_CUBIC)
    return np.clip(128 + 60 * large, 0, 255).astype(np.uint8)


def draws(seed: int, count: int) -> list[float]:
    torch.manual_seed(seed)
    return [torch.rand(()).item() for _ in range(count)]


@pytest.mark.parametrize("seed", range(4))
def test_geometric_jitter_is_the_drawn_similarity_transform(seed):
    """Rotation about the centre, zoom, then shift, as SciPy samples it from the inverse map."""
    image = smooth_image()
    height, width = image.shape[:2]
    jitter = GeometricJitter(rotation=15.0, shift=0.1, scale=(0.85, 1.15))
    torch.manual_seed(seed)
    out = jitter(image)

    u_angle, u_zoom, u_x, u_y = draws(seed, 4)
    angle = math.radians(-15 + 30 * u_angle)
    zoom = 0.85 + 0.3 * u_zoom
    shift = np.array([(-0.1 + 0.2 * u_y) * height, (-0.1 + 0.2 * u_x) * width])
    centre = np.array([(height - 1) / 2, (width - 1) / 2])
    # output (row, col) = centre + zoom R (input - centre) + shift; a positive angle turns the picture
    # counter-clockwise on screen, as OpenCV defines it
    rotation = np.array([[math.cos(angle), -math.sin(angle)], [math.sin(angle), math.cos(angle)]])
    forward = zoom * rotation
    inverse = np.linalg.inv(forward)
    offset = centre - inverse @ (centre + shift)
    expected = np.stack(
        [
            ndimage.affine_transform(
                image[..., c].astype(np.float64), inverse, offset, order=1, mode="mirror"
            )
            for c in range(3)
        ],
        axis=-1,
    )
    margin = 8  # the border is mirrored slightly differently (OpenCV reflect-101 and SciPy mirror agree)
    inner = (slice(margin, height - margin), slice(margin, width - margin))
    assert out.shape == image.shape and out.dtype == np.uint8
    assert np.abs(out[inner].astype(np.float64) - expected[inner]).max() <= 1.5


def test_geometric_jitter_without_range_is_the_identity():
    image = smooth_image()
    assert np.array_equal(GeometricJitter(0.0, 0.0, (1.0, 1.0))(image), image)


def test_gray_is_the_luma_a_greyscale_file_decodes_to(tmp_path):
    image = smooth_image()
    luma = np.rint(image.astype(np.float64) @ np.array([0.299, 0.587, 0.114]))
    grey = RandomGray(1.0)(image)
    assert np.abs(grey.astype(np.float64) - luma[..., None]).max() <= 1
    assert np.array_equal(grey[..., 0], grey[..., 1]) and np.array_equal(grey[..., 0], grey[..., 2])
    # a greyscale PGM of the same picture decodes to the same three channels, and the eval pipeline
    # then gives both one tensor: a colour set trained with grey images sees ORL-like inputs
    cv2.imwrite(str(tmp_path / "grey.pgm"), cv2.cvtColor(image, cv2.COLOR_RGB2GRAY))
    decoded = decode_image(tmp_path / "grey.pgm")
    assert np.array_equal(decoded, grey)
    evaluate = build_eval_transform([32, 28])
    assert torch.equal(evaluate(decoded), evaluate(grey))
    assert np.array_equal(RandomGray(1.0)(decoded), decoded)  # grey stays grey
    assert np.array_equal(RandomGray(0.0)(image), image)


def test_blur_is_a_gaussian_filter_of_the_drawn_sigma():
    image = smooth_image(seed=3)
    torch.manual_seed(5)
    out = RandomBlur(1.0, (0.8, 1.6))(image)
    _, u_sigma = draws(5, 2)
    sigma = 0.8 + 0.8 * u_sigma
    expected = ndimage.gaussian_filter(
        image.astype(np.float64), sigma=(sigma, sigma, 0), mode="mirror", truncate=3
    )
    assert np.abs(out.astype(np.float64) - expected).max() <= 1.5
    assert np.array_equal(RandomBlur(0.0, (0.8, 1.6))(image), image)


def test_erasing_blanks_one_rectangle_of_the_drawn_area_with_the_mean_grey():
    tensor = torch.rand(3, 40, 36) * 2 - 1 + 5  # no pixel is 0 before erasing
    erase = random_erasing(1.0, (0.1, 0.2))
    for seed in range(20):
        torch.manual_seed(seed)
        out = erase(tensor.clone())
        blank = (out == 0).all(dim=0)
        rows, cols = torch.nonzero(blank, as_tuple=True)
        height, width = int(rows.max() - rows.min()) + 1, int(cols.max() - cols.min()) + 1
        assert int(blank.sum()) == height * width  # one filled rectangle
        assert 0.1 * 40 * 36 * 0.8 <= height * width <= 0.2 * 40 * 36 * 1.2  # area rounded to whole pixels
        assert torch.equal(out[:, ~blank], tensor[:, ~blank])


@pytest.mark.parametrize(
    "make",
    [lambda p: RandomGray(p), lambda p: RandomBlur(p, (1.0, 1.0))],
    ids=["gray", "blur"],
)
def test_probabilities_are_honoured(make):
    image = smooth_image(24, 20)
    torch.manual_seed(0)
    changed = sum(not np.array_equal(make(0.3)(image), image) for _ in range(400))
    assert 0.22 * 400 <= changed <= 0.38 * 400


FULL = AugmentConfig(
    horizontal_flip=True,
    random_resized_crop=True,
    crop_scale=[0.7, 1.0],
    color_jitter=0.3,
    rotation=10.0,
    shift=0.08,
    scale=[0.9, 1.1],
    grayscale=0.3,
    blur=0.3,
    random_erasing=0.5,
)


def test_every_augmentation_together_follows_the_seed_and_keeps_shape_and_range():
    image = smooth_image(56, 48)
    transform = build_train_transform([32, 28], FULL)
    torch.manual_seed(11)
    first = [transform(image) for _ in range(8)]
    torch.manual_seed(11)
    second = [transform(image) for _ in range(8)]
    for a, b in zip(first, second):
        assert a.shape == (3, 32, 28) and a.dtype == torch.float32
        assert torch.equal(a, b) and -1.0 <= a.min() and a.max() <= 1.0
    assert len({tuple(t.flatten()[:50].tolist()) for t in first}) == 8


def test_new_keys_off_leave_the_old_pipeline_bit_for_bit():
    """Defaults of the new keys change nothing: the same draws, the same tensors as before them."""
    image = smooth_image(56, 48)
    old = AugmentConfig(
        horizontal_flip=True, random_resized_crop=True, crop_scale=[0.6, 1.0], color_jitter=0.3
    )
    transform = build_train_transform([32, 28], old)
    from torchvision.transforms import v2

    crop = v2.RandomResizedCrop((32, 28), scale=(0.6, 1.0), antialias=True)
    jitter = v2.ColorJitter(brightness=0.3, contrast=0.3, saturation=0.3)
    for seed in range(5):
        torch.manual_seed(seed)
        out = transform(image)
        torch.manual_seed(seed)
        flipped = cv2.flip(image, 1) if torch.rand(()).item() < 0.5 else image
        chw = torch.from_numpy(np.ascontiguousarray(flipped.transpose(2, 0, 1)))
        expected = jitter(crop(chw)).float().div(255).sub(0.5).div(0.5)
        assert torch.equal(out, expected)
