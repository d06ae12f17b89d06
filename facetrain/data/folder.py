"""Image-folder source: `root/<identity>/<image>`, labels from the sorted identity names."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from facetrain.data.dataset import PathReader, SampleTable
from facetrain.data.decode import IMAGE_EXTENSIONS
from facetrain.data.source_record import DataSource, register_source
from facetrain.errors import FacetrainError


def is_image_name(name: str) -> bool:
    """Hidden files are left out: `._x.jpg` files that macOS copies leave beside images are not images."""
    return not name.startswith(".") and name.lower().endswith(IMAGE_EXTENSIONS)


def list_identity_images(identity_dir: Path) -> list[Path]:
    """Sorted image files of one identity folder (other files, e.g. notes, are ignored)."""
    names = sorted(
        entry.name
        for entry in folder_entries(identity_dir, "identity folder")
        if is_image_name(entry.name) and _followed(entry, entry.is_file)
    )
    return [identity_dir / name for name in names]


def folder_entries(folder: Path, what: str) -> list[os.DirEntry]:
    """The entries of `folder`, or one line saying why it cannot be listed (no permission, gone)."""
    try:
        with os.scandir(folder) as entries:
            return list(entries)
    except OSError as error:
        raise FacetrainError(
            f"cannot list {what} {folder}: {error.strerror or error}; make it readable or remove it"
        ) from None


def _followed(entry: os.DirEntry, test) -> bool:
    """`entry.is_dir()` or `is_file()`, which follow symlinks: a link that loops (or cannot be followed
    for another reason than a missing target, which is just not a file) is one line naming it."""
    try:
        return test()
    except OSError as error:
        raise FacetrainError(
            f"cannot follow {entry.path}: {error.strerror or error}; fix or remove the link"
        ) from None


def scan_image_folder(root: str | Path) -> SampleTable:
    """Every image under `root/<identity>/`; an empty identity folder is an error, not a silent class gap."""
    root = Path(root)
    if not root.is_dir():
        raise FacetrainError(f"image folder {root} does not exist or is not a folder; check data.path")
    identities = sorted(
        entry.name
        for entry in folder_entries(root, "image folder")
        if not entry.name.startswith(".") and _followed(entry, entry.is_dir)
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


register_source(
    "folder",
    DataSource(scan_image_folder, "folder", "a folder of root/<identity>/<image>", fallback=True),
)
