"""Samplers that split each epoch over ranks and resume from a global position mid-epoch.

Positions are global (samples consumed by all ranks together), so a checkpoint written on N ranks
resumes on M ranks with the same remaining order. The distributed sampler deals each epoch in blocks of
one micro-batch and ends it on a whole optimizer step, so with a global batch held constant
(train.global_batch) every micro-batch holds the same images on any number of ranks. Each sample comes
as a `SampleKey` whose augmentation seed derives from its global position, so its augmentation is the
same on any number of ranks and workers, resumed or not. Ranks are plain integers: no torch.distributed here.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch
from torch.utils.data import Sampler

from facetrain.data.sample_key import SampleKey, sample_keys
from facetrain.errors import FacetrainError


class ResumableDistributedSampler(Sampler[SampleKey]):
    """Each epoch: a seeded permutation, minus its first `consumed` entries, dealt to ranks in blocks.

    Block k of `batch_size` consecutive entries goes to rank k mod world_size, so micro-batch k of the
    epoch is the same images whichever rank takes it and however many ranks there are. With
    `drop_last` the epoch ends on a whole step of `step_samples` images (the global batch of one
    optimizer step; one block a rank by default), so every rank gets the same count, no rank waits for
    another at the end of an epoch, and a step never spans two epochs. `batch_size` 1 deals round-robin.
    """

    def __init__(
        self,
        num_samples: int,
        rank: int,
        world_size: int,
        seed: int = 0,
        shuffle: bool = True,
        drop_last: bool = True,
        batch_size: int = 1,
        step_samples: int | None = None,
    ):
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is outside [0, {world_size})")
        self.num_samples = num_samples
        self.rank, self.world_size = rank, world_size
        self.seed, self.shuffle, self.drop_last = seed, shuffle, drop_last
        self.batch_size = batch_size
        self.step_samples = step_samples or batch_size * world_size
        self.epoch, self.consumed = 0, 0

    def set_epoch(self, epoch: int, consumed: int = 0) -> None:
        """Start `epoch` after `consumed` samples that all ranks together have already used."""
        self.epoch, self.consumed = epoch, min(consumed, self.num_samples)

    def _order(self) -> torch.Tensor:
        if not self.shuffle:
            return torch.arange(self.num_samples)
        generator = torch.Generator().manual_seed(self.seed * 100_003 + self.epoch)
        return torch.randperm(self.num_samples, generator=generator)

    def _remaining(self) -> torch.Tensor:
        remaining = self._order()[self.consumed :]
        if self.drop_last:  # whole steps from here; from the epoch's start when resumed at such a step
            return remaining[: len(remaining) - len(remaining) % self.step_samples]
        round_ = self.batch_size * self.world_size  # one block for every rank
        padding = (-len(remaining)) % round_
        return torch.cat([remaining, remaining[:padding]]) if padding else remaining

    def __iter__(self) -> Iterator[SampleKey]:
        remaining = self._remaining().numpy()
        positions = self.consumed + np.arange(len(remaining))
        block = np.arange(len(remaining)) // self.batch_size
        mine = block % self.world_size == self.rank
        return iter(sample_keys(remaining[mine], self.seed, self.epoch, positions[mine]))

    def __len__(self) -> int:
        return len(self._remaining()) // self.world_size


class IdentitySampler(Sampler[SampleKey]):
    """P identities x K images per rank batch (the PK batches of re-id's metric losses).

    Each epoch shuffles the identities (seeded by seed and epoch) and cuts them into global batches of
    P x world_size identities; rank r takes its P of each. An identity with fewer than K images repeats
    some. The position is counted in samples, like ResumableDistributedSampler's, so both resume alike.
    """

    def __init__(
        self,
        labels: np.ndarray,
        batch_size: int,
        images_per_identity: int,
        rank: int,
        world_size: int,
        seed: int = 0,
    ):
        if images_per_identity < 1 or batch_size % images_per_identity:
            raise FacetrainError(
                f"train.batch_size ({batch_size}) must be a multiple of data.images_per_identity "
                f"({images_per_identity}) for the identity sampler"
            )
        self.labels = np.asarray(labels)
        self.k = images_per_identity
        self.p = batch_size // images_per_identity
        self.rank, self.world_size, self.seed = rank, world_size, seed
        self.by_identity = [np.flatnonzero(self.labels == c) for c in np.unique(self.labels)]
        if len(self.by_identity) < self.p * world_size:
            raise FacetrainError(
                f"the identity sampler needs {self.p * world_size} identities per global batch "
                f"(P={self.p} per rank x {world_size} ranks) but the data has {len(self.by_identity)}"
            )
        self.epoch, self.consumed = 0, 0

    def set_epoch(self, epoch: int, consumed: int = 0) -> None:
        self.epoch, self.consumed = epoch, consumed

    def _global_batches(self) -> list[list[int]]:
        rng = np.random.default_rng(self.seed * 100_003 + self.epoch)
        identities = rng.permutation(len(self.by_identity))
        group = self.p * self.world_size
        batches = []
        for first in range(0, len(identities) - group + 1, group):
            batch = []
            for identity in identities[first : first + group]:
                images = self.by_identity[identity]
                chosen = rng.choice(images, size=self.k, replace=len(images) < self.k)
                batch.extend(int(i) for i in chosen)
            batches.append(batch)
        return batches

    def __iter__(self) -> Iterator[SampleKey]:
        per_rank = self.p * self.k
        per_batch = per_rank * self.world_size
        first = self.consumed // per_batch
        for number, batch in enumerate(self._global_batches()[first:], start=first):
            mine = slice(self.rank * per_rank, (self.rank + 1) * per_rank)
            positions = number * per_batch + np.arange(per_batch)
            yield from sample_keys(np.asarray(batch)[mine], self.seed, self.epoch, positions[mine])

    def __len__(self) -> int:
        per_batch = self.p * self.k * self.world_size
        return max(0, len(self._global_batches()) - self.consumed // per_batch) * self.p * self.k
