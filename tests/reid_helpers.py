"""Tiny on-disk pedestrian sets for the re-id tests (no tests here).

A "person" is a top colour over a bottom colour (24 palette pairs, so colour alone never names a
person: every top and every bottom colour is shared by several); each camera lights the scene its own
way and puts its own background around the person, who stands at a random height and offset. Matching
across cameras therefore needs the two-colour layout, not the mean colour or the background.
"""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np

PALETTE = np.array(
    [(200, 40, 40), (40, 160, 40), (40, 60, 200), (210, 200, 40), (150, 60, 170), (230, 230, 230)],
    dtype=np.float64,
)
CAMERA_LIGHT = {1: 1.0, 2: 0.8}
CAMERA_BACKGROUND = {1: (90, 90, 90), 2: (150, 120, 80)}


def person_colours(pid: int) -> tuple[np.ndarray, np.ndarray]:
    top = pid % len(PALETTE)
    bottom = (top + 1 + (pid // len(PALETTE)) % (len(PALETTE) - 1)) % len(PALETTE)
    return PALETTE[top], PALETTE[bottom]


def pedestrian(pid: int, camera: int, seed: int, size: tuple[int, int] = (64, 32)) -> np.ndarray:
    """uint8 RGB HxWx3 of person `pid` seen by `camera`."""
    rng = np.random.default_rng(seed)
    height, width = size
    image = np.empty((height, width, 3))
    image[:] = CAMERA_BACKGROUND[camera]
    top, bottom = person_colours(pid)
    left = int(rng.integers(2, width // 4))
    right = width - int(rng.integers(2, width // 4))
    head = int(rng.integers(2, height // 8))
    waist = head + int(height * rng.uniform(0.4, 0.5))
    image[head:waist, left:right] = top
    image[waist : height - 2, left + 2 : right - 2] = bottom
    image *= CAMERA_LIGHT[camera] * rng.uniform(0.9, 1.1)
    image += rng.normal(scale=12, size=image.shape)
    return np.clip(image, 0, 255).astype(np.uint8)


def write_cuhk03_style(
    folder: Path, pids: range, shots_per_camera: int = 3, size: tuple[int, int] = (64, 32)
) -> Path:
    """`PPPP_KK.jpg` files, shots 00-04 by camera A (1) and 05-09 by camera B (2), as CUHK03's."""
    folder.mkdir(parents=True, exist_ok=True)
    for pid in pids:
        for camera, first_shot in ((1, 0), (2, 5)):
            for shot in range(first_shot, first_shot + shots_per_camera):
                image = pedestrian(pid, camera, seed=pid * 100 + shot, size=size)
                cv2.imwrite(str(folder / f"{pid:04d}_{shot:02d}.jpg"), cv2.cvtColor(image, cv2.COLOR_RGB2BGR))
    return folder
