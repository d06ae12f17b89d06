"""What saving and loading a checkpoint needs to know of the ranks doing it.

`facetrain.parallel.ParallelDims` answers all of it; the checkpoint code names only this protocol, so
checkpoint/ and parallel/ (both layer 2) stay independent of each other.
"""

from __future__ import annotations

from typing import Protocol

import torch.distributed as dist


class RankRoles(Protocol):
    @property
    def rank(self) -> int: ...

    @property
    def world_size(self) -> int: ...

    @property
    def is_primary(self) -> bool:
        """Rank 0: writes the files every rank shares (config, meta, pointers)."""
        ...

    @property
    def writes_backbone(self) -> bool:
        """Writes its stage's backbone weights (replica 0 of every stage)."""
        ...

    @property
    def control_group(self) -> dist.ProcessGroup | None:
        """The CPU group host-side waits go through (None: the default group)."""
        ...
