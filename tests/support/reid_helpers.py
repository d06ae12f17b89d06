"""Tiny on-disk pedestrian sets for the re-id tests (no tests here).

A "person" is a top colour over a bottom colour, and people come in pairs wearing the same two
colours the other way round, so the colours alone (what a mean or a histogram sees) never tell a
person from their twin: matching needs which colour is on top. Each camera casts its own colour over
the scene and puts its own background around the person, who stands at a random height and offset
among clutter in palette colours. Matching across cameras therefore needs the two-colour layout,
not the mean colour or the background: an untrained network ranks far worse than a trained one.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import cv2
import numpy as np

from tests.support.train_helpers import write_config

PALETTE = np.array(
    [(200, 40, 40), (40, 160, 40), (40, 60, 200), (210, 200, 40), (150, 60, 170), (230, 230, 230)],
    dtype=np.float64,
)
CAMERA_CAST = {1: np.array([1.0, 1.0, 1.0]), 2: np.array([0.75, 0.95, 1.25])}
CAMERA_BACKGROUND = {1: (90, 90, 90), 2: (150, 120, 80)}


COLOUR_PAIRS = list(itertools.combinations(range(len(PALETTE)), 2))


def person_colours(pid: int) -> tuple[np.ndarray, np.ndarray]:
    """Person 2n and 2n + 1 wear colour pair n, one top over bottom, the other bottom over top."""
    first, second = COLOUR_PAIRS[(pid // 2) % len(COLOUR_PAIRS)]
    top, bottom = (first, second) if pid % 2 == 0 else (second, first)
    return PALETTE[top], PALETTE[bottom]


def pedestrian(pid: int, camera: int, seed: int, size: tuple[int, int] = (64, 32)) -> np.ndarray:
    """uint8 RGB HxWx3 of person `pid` seen by `camera`."""
    rng = np.random.default_rng(seed)
    height, width = size
    image = np.empty((height, width, 3))
    image[:] = CAMERA_BACKGROUND[camera]
    for _ in range(6):  # clutter: blocks of palette colours around the person
        y, x = int(rng.integers(0, height - 8)), int(rng.integers(0, width - 4))
        image[y : y + 8, x : x + 4] = PALETTE[rng.integers(len(PALETTE))]
    top, bottom = person_colours(pid)
    left = int(rng.integers(2, width // 4))
    right = width - int(rng.integers(2, width // 4))
    head = int(rng.integers(2, height // 8))
    waist = head + int(height * rng.uniform(0.4, 0.5))
    image[head:waist, left:right] = top
    image[waist : height - 2, left + 2 : right - 2] = bottom
    image *= CAMERA_CAST[camera] * rng.uniform(0.8, 1.2)
    image += rng.normal(scale=30, size=image.shape)
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


def reid_config(tmp: Path, train_folder: Path, steps: int, output: str = "run", **sections) -> Path:
    """configs/reid_small.yaml's recipe shrunk to 32x16 images and a few identities: seconds on a CPU."""
    config = {
        "data": {
            "source": "reid",
            "path": str(train_folder),
            "image_size": [32, 16],
            "sampler": "identity",
            "images_per_identity": 4,
            "num_workers": 0,
            "augment": {
                "horizontal_flip": True,
                "shift": 0.06,
                "random_erasing": 0.5,
                "erasing_area": [0.02, 0.4],
            },
        },
        "model": {"backbone": "small_pooled", "embedding_size": 64},
        "head": {"margin": "cosface", "scale": 16.0, "margin_params": {"m": 0.2}},
        "loss": {"name": "margin_triplet", "triplet_margin": 0.3},
        "optim": {"name": "adamw", "lr": 3e-3, "weight_decay": 5e-4, "warmup_steps": 5, "schedule": "cosine"},
        "train": {
            "output_dir": str(tmp / output),
            "batch_size": 32,
            "steps": steps,
            "log_every": 5,
            "deterministic": True,
        },
        "checkpoint": {"every": 1000},
    }
    return write_config(tmp, output, config, sections)
