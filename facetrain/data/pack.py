"""Packing an image folder into insightface's RecordIO: `NAME.rec`, `NAME.idx` and `property`.

One large file reads faster than many small ones (`facetrain bench data` measures by how much), and it
is the layout insightface's own loaders read. `property` (`classes,height,width`) holds a single image
size, so every image must have it: a mixed folder is refused, naming the first image that differs,
rather than packed under a property that misstates it. The three files are written under temporary
names and renamed once every record is written, so an interrupted pack (or a full disk, or a file-size
limit) leaves nothing half-written and no temporary file; earlier files are replaced only when asked.
One pack at a time writes into a folder (its property file is the folder's): a second one is refused
in one line naming the first (`facetrain.output_lock`; the lock file is gone when the pack ends).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from facetrain.data.dataset import PathReader
from facetrain.data.decode import BadImageError, decode_image, image_file_problem
from facetrain.data.folder import scan_image_folder
from facetrain.data.image_header import image_dimensions
from facetrain.data.recordio import MAX_RECORD_BYTES, PROPERTY_NAME, write_table_recordio
from facetrain.errors import FacetrainError
from facetrain.files import atomic_target, check_output_path, make_output_folder, refuse_to_overwrite
from facetrain.output_files import refuse_what_is_no_file
from facetrain.output_lock import output_lock

LOCK_NAME = ".facetrain-pack.lock"


@dataclass(frozen=True)
class PackedSet:
    rec_path: Path
    idx_path: Path
    property_path: Path
    images: int
    identities: int
    height: int
    width: int


def packed_paths(rec_path: Path) -> tuple[Path, Path, Path]:
    """The .rec, its .idx and the property file beside them, where insightface looks for each."""
    return rec_path, rec_path.with_suffix(".idx"), rec_path.parent / PROPERTY_NAME


def _height_width(data: bytes, name: str) -> tuple[int, int]:
    """From the header when its format has one; other formats are decoded."""
    size = image_dimensions(data)
    if size is None:
        return tuple(decode_image(data, name).shape[:2])
    return size[1], size[0]


def pack_folder(folder: str | Path, rec_path: str | Path, overwrite: bool = False) -> PackedSet:
    """`folder/<identity>/<image>` into `rec_path` (label i: the i-th identity folder in sorted order),
    with its index and property file; images are stored as they are, not re-encoded."""
    rec_path = Path(rec_path)
    if rec_path.suffix != ".rec":
        raise FacetrainError(
            f"-o {rec_path}: name the packed file NAME.rec (NAME.idx and property are written beside it)"
        )
    check_output_path(rec_path, "-o")
    rec_path, idx_path, property_path = packed_paths(rec_path)
    refuse_what_is_no_file([rec_path, idx_path, property_path])  # before the work, not at the rename
    if not overwrite:
        refuse_to_overwrite([rec_path, idx_path, property_path])
    table = scan_image_folder(folder)
    table.reader = _HeaderFirst(table.reader)
    make_output_folder(rec_path.parent, "-o")
    with output_lock(
        rec_path.parent, LOCK_NAME, "facetrain pack", "wait for it to finish, or pack into another folder"
    ):
        if not overwrite:  # a pack that finished while this one scanned
            refuse_to_overwrite([rec_path, idx_path, property_path])
        return _pack(table, rec_path, idx_path, property_path)


def _pack(table, rec_path: Path, idx_path: Path, property_path: Path) -> PackedSet:
    sizes: list[tuple[int, int]] = []

    def same_size(index: int, data: bytes) -> None:
        size = _height_width(data, table.reader.name(index))
        if not sizes:
            sizes.append(size)
        elif size != sizes[0]:
            raise FacetrainError(
                f"{table.reader.name(index)} is {size[0]}x{size[1]} but {table.reader.name(0)} is "
                f"{sizes[0][0]}x{sizes[0][1]}; the property file holds one size: align the folder to one "
                "size first (facetrain align --size)"
            )

    identities = len(table.class_names)
    # the property file is written before the records move into place, so a disk that fills up on it
    # leaves the earlier three files as they were
    with atomic_target(property_path) as property_tmp:
        write_table_recordio(
            table, rec_path, idx_path, check_image=same_size,
            before_moving=lambda: property_tmp.write_text(f"{identities},{sizes[0][0]},{sizes[0][1]}\n"),
        )  # fmt: skip
    height, width = sizes[0]
    return PackedSet(rec_path, idx_path, property_path, len(table.labels), identities, height, width)


class _HeaderFirst:
    """The folder's images, each read whole only once its size and header say it can be packed: a file
    of 700 MB that was no image was read whole (24 s, 1.7 GB) before it was refused."""

    def __init__(self, reader: PathReader):
        self.reader = reader

    def __len__(self) -> int:
        return len(self.reader)

    def name(self, index: int) -> str:
        return self.reader.name(index)

    def read(self, index: int) -> bytes:
        path = self.reader.paths[index]
        try:
            size = os.stat(path).st_size
        except OSError:
            size = 0  # reading says why
        if size > MAX_RECORD_BYTES:
            raise BadImageError(
                f"image {path} holds {size} bytes, more than a RecordIO record can ({MAX_RECORD_BYTES}); "
                "check that it is an image, or leave it out"
            )
        problem = image_file_problem(path)
        if problem is not None:
            raise BadImageError(problem)
        return self.reader.read(index)
