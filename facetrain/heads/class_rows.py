"""The rows of per-class tensors (weight, optimizer state) that one tile of classes reads and writes."""

from __future__ import annotations

import torch

from facetrain.heads.rounding import store


class ClassRows:
    """A tile's classes: a range [start, stop) of the shard, or (Partial FC) the shard rows in `index`.

    `read` gives the rows in the dtype the arithmetic runs in: a view of the storage when that needs no
    conversion or gathering, so that updating it in place updates the storage; otherwise a copy, which
    `write` stores back (stochastically rounded into bf16 storage).
    """

    def __init__(self, start: int, stop: int, index: torch.Tensor | None = None):
        self.start, self.stop = start, stop
        self.index = None if index is None else index[start:stop]

    def __len__(self) -> int:
        return self.stop - self.start

    def read(self, storage: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        if self.index is not None:
            return storage.index_select(0, self.index).to(dtype)
        return storage[self.start : self.stop].to(dtype)

    def write(self, storage: torch.Tensor, values: torch.Tensor) -> None:
        if self.index is not None:
            storage.index_copy_(0, self.index, store(values, storage.dtype))
            return
        target = storage[self.start : self.stop]
        if values.data_ptr() != target.data_ptr():  # a view was updated in place already
            target.copy_(store(values, storage.dtype))


def class_tiles(width: int, tile_classes: int, index: torch.Tensor | None = None) -> list[ClassRows]:
    """`width` classes (all of the shard, or the `index` rows Partial FC kept) in tiles of at most
    `tile_classes`; the last tile holds the remainder."""
    return [
        ClassRows(start, min(start + tile_classes, width), index) for start in range(0, width, tile_classes)
    ]
