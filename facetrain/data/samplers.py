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

    Each epoch shuffles the identities (seeded by seed and epoch), draws K images of each in that order
    (an identity with fewer than K repeats some) and cuts them into micro-batches of P identities;
    micro-batch k goes to rank k mod world_size, as ResumableDistributedSampler deals its blocks. The
    epoch ends on a whole step of `step_samples` images, so with a global batch held constant
    (train.global_batch) every micro-batch holds the same images on any number of ranks, and the
    identities of one step are distinct. The position is counted in samples, so both samplers resume alike.
    """

    def __init__(
        self,
        labels: np.ndarray,
        batch_size: int,
        images_per_identity: int,
        rank: int,
        world_size: int,
        seed: int = 0,
        step_samples: int | None = None,
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
        self.step_samples = step_samples or batch_size * world_size
        self.by_identity = [np.flatnonzero(self.labels == c) for c in np.unique(self.labels)]
        step_identities = self.step_samples // self.k
        if len(self.by_identity) < step_identities:
            raise FacetrainError(
                f"the identity sampler needs {step_identities} identities per global batch "
                f"(P={self.p} per micro-batch x {self.step_samples // batch_size} micro-batches a step) "
                f"but the data has {len(self.by_identity)}"
            )
        self.epoch, self.consumed = 0, 0

    def set_epoch(self, epoch: int, consumed: int = 0) -> None:
        self.epoch, self.consumed = epoch, consumed

    def _micro_batches(self) -> np.ndarray:
        """The epoch's micro-batches of P x K image indices, ending on a whole step."""
        rng = np.random.default_rng(self.seed * 100_003 + self.epoch)
        identities = rng.permutation(len(self.by_identity))
        step_identities = self.step_samples // self.k
        identities = identities[: len(identities) - len(identities) % step_identities]
        images = [
            rng.choice(self.by_identity[i], size=self.k, replace=len(self.by_identity[i]) < self.k)
            for i in identities
        ]
        return np.asarray(images, dtype=np.int64).reshape(-1, self.p * self.k)

    def __iter__(self) -> Iterator[SampleKey]:
        per_micro = self.p * self.k
        first = self.consumed // per_micro
        micro_batches = self._micro_batches()
        for number in range(first, len(micro_batches)):
            if number % self.world_size == self.rank:
                positions = number * per_micro + np.arange(per_micro)
                yield from sample_keys(micro_batches[number], self.seed, self.epoch, positions)

    def __len__(self) -> int:
        per_micro = self.p * self.k
        remaining = max(0, len(self._micro_batches()) - self.consumed // per_micro)
        return remaining // self.world_size * per_micro
