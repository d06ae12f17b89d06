"""The one training dataset type: encoded images from any source, decoded and transformed on access.

Sources only differ in where the encoded bytes live (files, a RecordIO file) and how labels are found,
so each source builds a `SampleTable` and every source shares `FaceDataset`'s decoding, bad-image
handling and label bookkeeping.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np
import torch
from torch.utils.data import Dataset

from facetrain.data.decode import BadImageError, DataError, decode_image, read_file_bytes
from facetrain.data.loader_workers import platform_context
from facetrain.data.sample_key import SampleKey
from facetrain.errors import FacetrainError
from facetrain.logger import logger

BAD_IMAGE_ADVICE = (
    "fix or remove it (or its list entry), or set data.skip_bad_images: true to skip such images"
)


class EncodedImageReader(Protocol):
    """Random access to the encoded bytes of sample `index` and a name for it in messages."""

    def __len__(self) -> int: ...

    def read(self, index: int) -> bytes: ...

    def name(self, index: int) -> str: ...


class PathReader:
    """Encoded images stored one per file."""

    def __init__(self, paths: list[Path]):
        self.paths = paths

    def __len__(self) -> int:
        return len(self.paths)

    def read(self, index: int) -> bytes:
        return read_file_bytes(self.paths[index])

    def name(self, index: int) -> str:
        return str(self.paths[index])


@dataclass
class SampleTable:
    """What a source found: where each sample's bytes are, its label, and the label -> identity map."""

    reader: EncodedImageReader
    labels: np.ndarray
    class_names: list[str]
    description: str
    cameras: np.ndarray | None = field(default=None)

    def __post_init__(self) -> None:
        self.labels = np.asarray(self.labels, dtype=np.int64)
        if len(self.labels) == 0:
            raise FacetrainError(f"dataset {self.description} has no images; check data.path and data.source")
        if len(self.labels) != len(self.reader):
            raise ValueError("a sample table needs exactly one label per image")


class FaceDataset(Dataset):
    """`(image CHW float32, label)` pairs; with `skip_bad_images` an unreadable image is replaced.

    The replacement is the next readable sample, so batches keep their size. Each skip is counted in a
    process-shared counter, so `bad_images` in the main process includes skips made in DataLoader
    workers (the counter travels to the workers with the dataset when they start).

    Indexed by a `SampleKey` (what the training samplers yield), the transform runs on torch's CPU
    generator seeded with the key's augmentation seed, and the generator's state is put back afterwards:
    a sample's augmentation is then a function of its key alone, not of the worker that decodes it or of
    what that worker decoded before, and the caller's random stream is untouched. A plain index uses the
    process's random stream as it is.
    """

    def __init__(
        self,
        table: SampleTable,
        transform: Callable[[np.ndarray], torch.Tensor],
        skip_bad_images: bool = False,
    ):
        self.table = table
        self.transform = transform
        self.skip_bad_images = skip_bad_images
        # shared with the loader workers, which start the platform's way (see platform_context)
        self._bad_count = platform_context().Value("q", 0)

    @property
    def labels(self) -> np.ndarray:
        return self.table.labels

    @property
    def class_names(self) -> list[str]:
        return self.table.class_names

    @property
    def num_classes(self) -> int:
        return len(self.table.class_names)

    @property
    def cameras(self) -> np.ndarray | None:
        return self.table.cameras

    @property
    def bad_images(self) -> int:
        """Bad images skipped so far, in every process, since construction or `reset_bad_images`."""
        return int(self._bad_count.value)

    def reset_bad_images(self) -> None:
        with self._bad_count.get_lock():
            self._bad_count.value = 0

    def __len__(self) -> int:
        return len(self.table.labels)

    def __getitem__(self, index: int | SampleKey) -> tuple[torch.Tensor, int]:
        if isinstance(index, SampleKey):
            with torch.random.fork_rng(devices=[]):
                torch.default_generator.manual_seed(index.augment_seed)
                return self._load(int(index))
        return self._load(index)

    def _load(self, index: int) -> tuple[torch.Tensor, int]:
        size = len(self)
        if not -size <= index < size:
            raise IndexError(f"sample {index} of a dataset of {size}")
        for offset in range(size):
            candidate = (index + offset) % size
            try:
                image = decode_image(
                    self.table.reader.read(candidate), name=self.table.reader.name(candidate)
                )
            except BadImageError as error:
                if not self.skip_bad_images:
                    raise BadImageError(f"{error}; {BAD_IMAGE_ADVICE}") from None
                with self._bad_count.get_lock():
                    self._bad_count.value += 1
                logger.warning("skipping bad image: %s", error)
                continue
            return self.transform(image), int(self.table.labels[candidate])
        raise DataError(f"every image of dataset {self.table.description} is unreadable; check data.path")


class KeyedSamples(Dataset):
    """`dataset`'s `(image, label)` with the sample's index appended, `(image, label, index)`: for what
    keeps something per training image across epochs (`loss.teacher_cache`). The index is the key's
    `int`, the same each epoch, while its augmentation seed is not."""

    def __init__(self, dataset: FaceDataset):
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, key: int | SampleKey) -> tuple[torch.Tensor, int, int]:
        return (*self.dataset[key], int(key))
