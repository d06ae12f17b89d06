"""Turning the paths a user types into the list of images to embed."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from facetrain.data.decode import IMAGE_EXTENSIONS
from facetrain.errors import FacetrainError


def collect_images(paths: Iterable[str | Path]) -> list[Path]:
    """Image files named directly, plus every image under the named folders (recursively, sorted).

    Files named directly are kept whatever their extension, so an oddly named image still works;
    folders contribute only files with image extensions. Duplicates keep their first position.
    """
    images: dict[Path, None] = {}
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            found = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in IMAGE_EXTENSIONS)
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
