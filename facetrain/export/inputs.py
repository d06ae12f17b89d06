"""Turning the paths a user types into the list of images to embed."""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from pathlib import Path

from facetrain.data.decode import IMAGE_EXTENSIONS
from facetrain.data.folder import is_image_name
from facetrain.errors import FacetrainError


def collect_images(paths: Iterable[str | Path]) -> list[Path]:
    """Image files named directly, plus every image under the named folders (recursively, sorted).

    Files named directly are kept whatever their extension, so an oddly named image still works;
    folders contribute only image files, found as training finds them: symlinked folders are
    followed and hidden files and folders are left out. Duplicates keep their first position.
    """
    images: dict[Path, None] = {}
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            found = sorted(_images_under(path))
            if not found:
                raise FacetrainError(f"folder {path} contains no images ({', '.join(IMAGE_EXTENSIONS)})")
            images.update(dict.fromkeys(found))
        elif path.is_file():
            images[path] = None
        else:
            raise FacetrainError(f"{path} does not exist; pass image files or folders of images")
    if not images:
        raise FacetrainError("no images given; pass image files or folders of images")
    return list(images)


def _images_under(root: Path) -> Iterator[Path]:
    """Image files below `root`, following symlinked folders; a link back to a folder already walked
    (a cycle) is not entered twice."""
    walked: set[str] = set()
    for folder, subfolders, files in os.walk(root, followlinks=True):
        real = os.path.realpath(folder)
        if real in walked:
            subfolders.clear()
            continue
        walked.add(real)
        subfolders[:] = [name for name in subfolders if not name.startswith(".")]
        for name in files:
            candidate = Path(folder) / name
            if is_image_name(name) and candidate.is_file():
                yield candidate
