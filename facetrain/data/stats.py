"""What a dataset holds before a run is spent on it: identities, images per identity, corrupt files.

Corrupt files are found by decoding every image exactly as training would, so a file that passes here
will not stop an epoch. Decoding is spread over worker processes because large sets (MS1M, Glint360K)
hold millions of images.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from facetrain.choices import STATS_SOURCES
from facetrain.data.dataset import EncodedImageReader, SampleTable
from facetrain.data.decode import BadImageError, decode_image
from facetrain.data.sources import SOURCES
from facetrain.errors import FacetrainError
from facetrain.progress import ProgressBar

LIST_SUFFIXES = (".csv", ".tsv", ".txt")
_CHUNK = 256


@dataclass
class DatasetStats:
    source: str
    path: str
    identities: int
    images: int
    images_per_identity: pd.Series
    cameras: int | None
    corrupt: list[str] | None  # None when the images were not decoded


def guess_source(path: str | Path) -> str:
    """The source a path looks like: a `.rec` or a folder holding `train.rec`, a list file, Market-1501,
    else an image folder."""
    path = Path(path)
    if path.is_file():
        suffix = path.suffix.lower()
        if suffix == ".rec":
            return "recordio"
        if suffix in LIST_SUFFIXES:
            return "list"
        raise FacetrainError(
            f"cannot tell what kind of dataset {path} is; pass --source {'|'.join(STATS_SOURCES)}"
        )
    if not path.is_dir():
        raise FacetrainError(f"dataset {path} does not exist")
    if (path / "bounding_box_train").is_dir():
        return "market1501"
    if (path / "train.rec").is_file():
        return "recordio"
    return "folder"


def load_sample_table(path: str | Path, source: str) -> SampleTable:
    if source not in STATS_SOURCES:
        raise FacetrainError(f"unknown dataset source {source!r}; choose one of: {', '.join(STATS_SOURCES)}")
    return SOURCES.build(source, str(path))


_worker_reader: EncodedImageReader | None = None


def _keep_reader(reader: EncodedImageReader) -> None:
    global _worker_reader
    _worker_reader = reader


def _corrupt_in_range(bounds: tuple[int, int]) -> list[str]:
    assert _worker_reader is not None
    return _corrupt_in(_worker_reader, range(*bounds))


def _corrupt_in(reader: EncodedImageReader, indices: range) -> list[str]:
    corrupt = []
    for index in indices:
        try:
            decode_image(reader.read(index), name=reader.name(index))
        except BadImageError:
            corrupt.append(reader.name(index))
    return corrupt


def _chunks(count: int) -> Iterator[tuple[int, int]]:
    for start in range(0, count, _CHUNK):
        yield start, min(start + _CHUNK, count)


def find_corrupt_images(reader: EncodedImageReader, workers: int = 1, progress: bool = True) -> list[str]:
    """Names of the images that cannot be read or decoded, in dataset order."""
    count = len(reader)
    bar = ProgressBar(total=count, desc="decoding", unit="img", disable=not progress)
    corrupt: list[str] = []
    with bar:
        if workers <= 1 or count <= _CHUNK:
            for bounds in _chunks(count):
                corrupt += _corrupt_in(reader, range(*bounds))
                bar.update(bounds[1] - bounds[0])
            return corrupt
        with ProcessPoolExecutor(workers, initializer=_keep_reader, initargs=(reader,)) as pool:
            for bounds, found in zip(_chunks(count), pool.map(_corrupt_in_range, _chunks(count))):
                corrupt += found
                bar.update(bounds[1] - bounds[0])
    return corrupt


def collect_stats(
    path: str | Path,
    source: str | None = None,
    decode: bool = True,
    workers: int = 1,
    progress: bool = True,
) -> DatasetStats:
    source = source or guess_source(path)
    table = load_sample_table(path, source)
    per_identity = np.bincount(table.labels, minlength=len(table.class_names))
    cameras = None
    if table.cameras is not None and (table.cameras >= 0).any():
        cameras = int(np.unique(table.cameras[table.cameras >= 0]).size)
    return DatasetStats(
        source=source,
        path=str(path),
        identities=len(table.class_names),
        images=len(table.labels),
        images_per_identity=pd.Series(per_identity).describe(),
        cameras=cameras,
        corrupt=find_corrupt_images(table.reader, workers, progress) if decode else None,
    )


def format_stats(stats: DatasetStats) -> str:
    lines = [
        f"source      {stats.source}",
        f"path        {stats.path}",
        f"identities  {stats.identities}",
        f"images      {stats.images}",
    ]
    if stats.cameras is not None:
        lines.append(f"cameras     {stats.cameras}")
    summary = stats.images_per_identity.to_string(float_format=lambda value: f"{value:.4g}")
    lines += ["", "images per identity", summary, ""]
    if stats.corrupt is None:
        lines.append("corrupt images: not checked (--no-decode)")
    else:
        lines.append(f"corrupt images: {len(stats.corrupt)} of {stats.images} decoded")
        lines += [f"  {name}" for name in stats.corrupt]
    return "\n".join(lines)
