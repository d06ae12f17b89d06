"""Image-folder source: `root/<identity>/<image>`, labels from the sorted identity names."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from facetrain.data.dataset import PathReader, SampleTable
from facetrain.data.decode import IMAGE_EXTENSIONS
from facetrain.errors import FacetrainError


def is_image_name(name: str) -> bool:
    """Hidden files are left out: `._x.jpg` files that macOS copies leave beside images are not images."""
    return not name.startswith(".") and name.lower().endswith(IMAGE_EXTENSIONS)


def list_identity_images(identity_dir: Path) -> list[Path]:
    """Sorted image files of one identity folder (other files, e.g. notes, are ignored)."""
    with os.scandir(identity_dir) as entries:
        names = sorted(entry.name for entry in entries if entry.is_file() and is_image_name(entry.name))
    return [identity_dir / name for name in names]


def scan_image_folder(root: str | Path) -> SampleTable:
    """Every image under `root/<identity>/`; an empty identity folder is an error, not a silent class gap."""
    root = Path(root)
    if not root.is_dir():
        raise FacetrainError(f"image folder {root} does not exist or is not a folder; check data.path")
    with os.scandir(root) as entries:
        identities = sorted(
            entry.name for entry in entries if entry.is_dir() and not entry.name.startswith(".")
        )
    if not identities:
        raise FacetrainError(
            f"image folder {root} has no identity folders; expected {root}/<identity>/<image>"
        )
    paths: list[Path] = []
    labels: list[int] = []
    for label, identity in enumerate(identities):
        images = list_identity_images(root / identity)
        if not images:
            raise FacetrainError(
                f"identity folder {root / identity} has no images ({', '.join(IMAGE_EXTENSIONS)}); "
                "add images or remove the folder"
            )
        paths.extend(images)
        labels.extend([label] * len(images))
    return SampleTable(PathReader(paths), np.asarray(labels), identities, description=str(root))
