"""Packing an image folder into insightface's RecordIO: `NAME.rec`, `NAME.idx` and `property`.

One large file reads faster than many small ones (`facetrain bench data` measures by how much), and it
is the layout insightface's own loaders read. `property` (`classes,height,width`) holds a single image
size, so every image must have it: a mixed folder is refused, naming the first image that differs,
rather than packed under a property that misstates it. The three files are written under temporary
names and renamed once every record is written, so an interrupted pack leaves nothing half-written;
earlier files are replaced only when asked.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from facetrain.data.decode import decode_image
from facetrain.data.folder import scan_image_folder
from facetrain.data.image_header import image_dimensions
from facetrain.data.recordio import PROPERTY_NAME, write_table_recordio
from facetrain.errors import FacetrainError
from facetrain.files import refuse_to_overwrite, write_atomic


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
    rec_path, idx_path, property_path = packed_paths(rec_path)
    if not overwrite:
        refuse_to_overwrite([rec_path, idx_path, property_path])
    table = scan_image_folder(folder)
    rec_path.parent.mkdir(parents=True, exist_ok=True)
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

    write_table_recordio(table, rec_path, idx_path, check_image=same_size)
    height, width = sizes[0]
    identities = len(table.class_names)
    write_atomic(property_path, lambda tmp: tmp.write_text(f"{identities},{height},{width}\n"))
    return PackedSet(rec_path, idx_path, property_path, len(table.labels), identities, height, width)
