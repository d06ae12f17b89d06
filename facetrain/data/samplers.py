"""Samplers that split each epoch over ranks and can resume mid-epoch, also on another number of ranks.

Both samplers fix the epoch's global order from (seed, epoch) alone and deal it round-robin to the
ranks. Because of the round-robin, the samples (or batches) all ranks have consumed after any number
of whole steps are exactly a prefix of that global order, so a checkpoint records one number,
`consumed`, and `set_epoch(epoch, consumed)` continues the same order on any world size.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
import torch
from torch.utils.data import Sampler

from facetrain.errors import FacetrainError


def _check_rank(rank: int, world_size: int) -> None:
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is outside a world of size {world_size}")


def _epoch_generator(seed: int, epoch: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed * 1_000_003 + epoch)


class ResumableDistributedSampler(Sampler[int]):
    """Sample indices: the epoch's permutation minus its first `consumed` entries, dealt round-robin.

    With `drop_last` the remainder is cut to a multiple of the world size; without it, the
    remainder is padded from its own start so every rank gets the same count.
    """

    def __init__(
        self,
        num_samples: int,
        rank: int,
        world_size: int,
        seed: int = 0,
        shuffle: bool = True,
        drop_last: bool = True,
    ):
        _check_rank(rank, world_size)
        self.num_samples = num_samples
        self.rank = rank
        self.world_size = world_size
        self.seed = seed
        self.shuffle = shuffle
        self.drop_last = drop_last
        self.epoch = 0
        self.consumed = 0

    def set_epoch(self, epoch: int, consumed: int = 0) -> None:
        """Start `epoch` after `consumed` samples, counted over all ranks together."""
        if not 0 <= consumed <= self.num_samples:
            raise FacetrainError(
                f"cannot resume after {consumed} samples of an epoch of {self.num_samples}; "
                "the checkpoint does not belong to this dataset"
            )
        self.epoch = epoch
        self.consumed = consumed

    def epoch_order(self) -> torch.Tensor:
        """The global order of the whole epoch (all ranks)."""
        if self.shuffle:
            return torch.randperm(self.num_samples, generator=_epoch_generator(self.seed, self.epoch))
        return torch.arange(self.num_samples)

    def _remaining(self) -> torch.Tensor:
        remaining = self.epoch_order()[self.consumed :]
        if self.drop_last:
            return remaining[: len(remaining) - len(remaining) % self.world_size]
        shortfall = -len(remaining) % self.world_size
        if shortfall and len(remaining):
            repeats = -(-shortfall // len(remaining))
            remaining = torch.cat([remaining, remaining.repeat(repeats)[:shortfall]])
        return remaining

    def __iter__(self) -> Iterator[int]:
        return iter(self._remaining()[self.rank :: self.world_size].tolist())

    def __len__(self) -> int:
        remaining = self.num_samples - self.consumed
        if self.drop_last:
            return remaining // self.world_size
        return -(-remaining // self.world_size)


class IdentitySampler(Sampler[list[int]]):
    """Batches of P identities x K images (a batch sampler), for metric losses in re-identification.

    Per epoch each identity's images are shuffled and cut into groups of K (an identity with fewer
    than K images repeats some), the groups are shuffled, and batches take P groups of distinct
    identities. Batches are dealt round-robin to ranks; `consumed` counts samples over all ranks and
    must be a whole number of global steps' worth of batches.
    """

    def __init__(
        self,
        labels: Sequence[int] | np.ndarray,
        identities_per_batch: int,
        images_per_identity: int,
        rank: int,
        world_size: int,
        seed: int = 0,
    ):
        _check_rank(rank, world_size)
        self.labels = np.asarray(labels, dtype=np.int64)
        self.identities_per_batch = identities_per_batch
        self.images_per_identity = images_per_identity
        self.rank = rank
        self.world_size = world_size
        self.seed = seed
        self.epoch = 0
        self.consumed = 0
        identities, inverse = np.unique(self.labels, return_inverse=True)
        if identities_per_batch < 1 or images_per_identity < 1:
            raise FacetrainError("the identity sampler needs at least 1 identity and 1 image per identity")
        if len(identities) < identities_per_batch:
            raise FacetrainError(
                f"the identity sampler needs {identities_per_batch} identities per batch but the dataset "
                f"has {len(identities)}; lower train.batch_size or raise data.images_per_identity"
            )
        order = np.argsort(inverse, kind="stable")
        bounds = np.searchsorted(inverse[order], np.arange(len(identities) + 1))
        self._members = [order[bounds[i] : bounds[i + 1]] for i in range(len(identities))]
        self._cached: tuple[int, list[list[int]]] | None = None

    @property
    def batch_size(self) -> int:
        return self.identities_per_batch * self.images_per_identity

    def set_epoch(self, epoch: int, consumed: int = 0) -> None:
        """Start `epoch` after `consumed` samples, counted over all ranks together."""
        if consumed < 0 or consumed % self.batch_size:
            raise FacetrainError(
                f"cannot resume the identity sampler after {consumed} samples: not a multiple of the "
                f"batch of {self.batch_size}; keep train.batch_size and data.images_per_identity as in the run"
            )
        self.epoch = epoch
        self.consumed = consumed

    def epoch_batches(self) -> list[list[int]]:
        """Every batch of the epoch, in global order."""
        if self._cached is None or self._cached[0] != self.epoch:
            self._cached = (self.epoch, self._draw_batches())
        return self._cached[1]

    def _draw_batches(self) -> list[list[int]]:
        rng = np.random.default_rng([self.seed, self.epoch])
        k = self.images_per_identity
        groups: list[tuple[int, np.ndarray]] = []
        for identity, members in enumerate(self._members):
            shuffled = rng.permutation(members)
            if len(shuffled) < k:
                shuffled = np.concatenate([shuffled, rng.choice(members, k - len(shuffled))])
            for start in range(0, len(shuffled) - k + 1, k):
                groups.append((identity, shuffled[start : start + k]))
        pending = [groups[i] for i in rng.permutation(len(groups))]
        batches: list[list[int]] = []
        while len(pending) >= self.identities_per_batch:
            chosen: list[int] = []
            taken: set[int] = set()
            for position, (identity, _) in enumerate(pending):
                if identity not in taken:
                    taken.add(identity)
                    chosen.append(position)
                    if len(chosen) == self.identities_per_batch:
                        break
            if len(chosen) < self.identities_per_batch:
                break
            batches.append([int(i) for position in chosen for i in pending[position][1]])
            chosen_set = set(chosen)
            pending = [group for position, group in enumerate(pending) if position not in chosen_set]
        return batches

    def _remaining(self) -> list[list[int]]:
        batches = self.epoch_batches()[self.consumed // self.batch_size :]
        return batches[: len(batches) - len(batches) % self.world_size]

    def __iter__(self) -> Iterator[list[int]]:
        return iter(self._remaining()[self.rank :: self.world_size])

    def __len__(self) -> int:
        return len(self._remaining()) // self.world_size
