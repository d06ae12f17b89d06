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

from facetrain.data.dataset import EncodedImageReader, SampleTable
from facetrain.data.decode import BadImageError, decode_image
from facetrain.data.sources import SOURCES, inspectable_sources, source_record
from facetrain.errors import FacetrainError
from facetrain.progress import ProgressBar

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
    """The source whose record recognises the path (the first by name), else the fallback for a
    path of its kind (an image folder)."""
    path = Path(path)
    if not path.is_file() and not path.is_dir():
        raise FacetrainError(f"dataset {path} does not exist")
    names = inspectable_sources()
    records = [(name, source_record(name)) for name in names]
    recognised = [name for name, record in records if record.recognise is not None and record.recognise(path)]
    kind = "file" if path.is_file() else "folder"
    fallback = [name for name, record in records if record.fallback and record.path_kind == kind]
    if recognised or fallback:
        return (recognised or fallback)[0]
    raise FacetrainError(f"cannot tell what kind of dataset {path} is; pass --source {'|'.join(names)}")


def load_sample_table(path: str | Path, source: str) -> SampleTable:
    names = inspectable_sources()
    if source not in names:
        raise FacetrainError(f"unknown dataset source {source!r}; choose one of: {', '.join(names)}")
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
