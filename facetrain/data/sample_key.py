"""Sample keys: a dataset index that also carries the seed of that sample's augmentation.

Training samplers yield `SampleKey`s instead of plain indices. The seed is a hash of (train seed,
epoch, position of the sample in the epoch's global order), so the flip, crop and colour jitter a
sample gets do not depend on which DataLoader worker decodes it, how many workers there are, how many
ranks share the epoch, or whether the run was resumed: a resumed run sees the same images with the
same augmentation as a straight one.

A key is an `int` (its index), so everything that takes sampler output as indices keeps working.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np


class SampleKey(int):
    """Dataset index `int(key)`, augmented with the generator seed `key.augment_seed`."""

    augment_seed: int

    def __new__(cls, index: int, augment_seed: int) -> SampleKey:
        key = super().__new__(cls, index)
        key.augment_seed = augment_seed
        return key

    def __reduce__(self):
        return SampleKey, (int(self), self.augment_seed)

    def __repr__(self) -> str:
        return f"SampleKey({int(self)}, augment_seed={self.augment_seed})"


def _mix(values: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser: nearby inputs give unrelated 64-bit outputs."""
    with np.errstate(over="ignore"):
        values = values ^ (values >> np.uint64(30))
        values = values * np.uint64(0xBF58476D1CE4E5B9)
        values = values ^ (values >> np.uint64(27))
        values = values * np.uint64(0x94D049BB133111EB)
        return values ^ (values >> np.uint64(31))


def augment_seeds(seed: int, epoch: int, positions: np.ndarray) -> np.ndarray:
    """The augmentation seed (63 bits, a valid torch seed) of each global position in an epoch."""
    with np.errstate(over="ignore"):
        base = _mix(np.uint64(seed) * np.uint64(0x9E3779B97F4A7C15) + np.uint64(epoch))
        mixed = _mix(base ^ _mix(np.asarray(positions, dtype=np.uint64) + np.uint64(1)))
    return (mixed >> np.uint64(1)).astype(np.int64)


def sample_keys(indices: np.ndarray, seed: int, epoch: int, positions: np.ndarray) -> Iterator[SampleKey]:
    """Keys for `indices` at `positions` of `epoch`, made one at a time as a loader asks for them."""
    seeds = augment_seeds(seed, epoch, positions)
    return map(SampleKey, np.asarray(indices).tolist(), seeds.tolist())
