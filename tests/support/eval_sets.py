"""Shared material of the evaluation tests (no tests here): tiny on-disk face sets and tiny models.

Each synthetic identity is a distinct colour with per-image noise, so a model that averages the
colour channels verifies them perfectly while a random conv net gives ordinary, imperfect scores.
"""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import torch
from torch import nn

IDENTITY_COLOURS = [
    (230, 20, 20),
    (20, 230, 20),
    (20, 20, 230),
    (230, 230, 20),
    (20, 230, 230),
    (230, 20, 230),
]


def colour_face(identity: int, seed: int, size: tuple[int, int] = (20, 16)) -> np.ndarray:
    """uint8 RGB HxWx3: the identity's colour plus noise and a left-right gradient (so flips matter)."""
    rng = np.random.default_rng(seed)
    base = np.array(IDENTITY_COLOURS[identity], dtype=np.float64)
    gradient = np.linspace(-15, 15, size[1])[None, :, None]
    noise = rng.normal(0, 8, (*size, 3))
    return np.clip(base + gradient + noise, 0, 255).astype(np.uint8)


def write_lfw_style_set(root: Path, identities: int = 6, per_identity: int = 4, folds: int = 2) -> Path:
    """Images at root/name/name_%04d.png and a View-2-style pairs.txt with `folds` folds; returns it."""
    names = [f"person_{identity}" for identity in range(identities)]
    for identity, name in enumerate(names):
        (root / name).mkdir(parents=True, exist_ok=True)
        for index in range(1, per_identity + 1):
            bgr = cv2.cvtColor(colour_face(identity, seed=identity * 100 + index), cv2.COLOR_RGB2BGR)
            cv2.imwrite(str(root / name / f"{name}_{index:04d}.png"), bgr)
    rng = np.random.default_rng(0)
    per_class = 3
    lines = [f"{folds}\t{per_class}"]
    for _ in range(folds):
        for _ in range(per_class):
            name = names[rng.integers(identities)]
            first, second = rng.choice(np.arange(1, per_identity + 1), 2, replace=False)
            lines.append(f"{name}\t{first}\t{second}")
        for _ in range(per_class):
            one, other = rng.choice(identities, 2, replace=False)
            lines.append(
                f"{names[one]}\t{rng.integers(1, per_identity + 1)}\t{names[other]}\t{rng.integers(1, per_identity + 1)}"
            )
    pairs = root / "pairs.txt"
    pairs.write_text("\n".join(lines) + "\n")
    return pairs


def write_market(root: Path) -> None:
    """3 people seen by cameras 1-2, plus a distractor and a junk box that copies a query's colour."""
    boxes = {
        "query": [(1, 1), (2, 1), (3, 2)],
        "bounding_box_test": [(1, 1), (1, 2), (2, 2), (2, 2), (3, 1), (0, 1), (-1, 2)],
    }
    for split, entries in boxes.items():
        (root / split).mkdir(parents=True)
        for index, (pid, camid) in enumerate(entries):
            identity = {0: 4, -1: 0}.get(pid, pid - 1)
            image = cv2.cvtColor(colour_face(identity, seed=index, size=(32, 16)), cv2.COLOR_RGB2BGR)
            cv2.imwrite(str(root / split / f"{pid:04d}_c{camid}s1_{index:06d}_00.jpg"), image)
    (root / "bounding_box_train").mkdir()


class ColourMean(nn.Module):
    """Embeds an image as its mean colour: a perfect verifier of the colour identities."""

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return images.mean(dim=(2, 3))


def tiny_conv_net(image_size: tuple[int, int], seed: int = 0, embedding_size: int = 8) -> nn.Module:
    """A random, deliberately asymmetric network, so that flipping the input changes its output."""
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Conv2d(3, 4, 3, padding=1),
        nn.BatchNorm2d(4),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(4 * image_size[0] * image_size[1], embedding_size),
    )


def touch_lfw_images(root: Path, names: dict[str, int], extension: str = ".jpg") -> None:
    for name, count in names.items():
        (root / name).mkdir(parents=True, exist_ok=True)
        for index in range(1, count + 1):
            (root / name / f"{name}_{index:04d}{extension}").write_bytes(b"")
