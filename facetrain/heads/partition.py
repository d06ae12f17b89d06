"""How C classes are dealt to N ranks: contiguous ranges whose sizes differ by at most one."""

from __future__ import annotations

from typing import NamedTuple


class ClassRange(NamedTuple):
    start: int
    count: int

    @property
    def stop(self) -> int:
        return self.start + self.count


def class_range(num_classes: int, world_size: int, rank: int) -> ClassRange:
    """The classes rank `rank` owns; the first C mod N ranks hold one class more."""
    base, extra = divmod(num_classes, world_size)
    return ClassRange(rank * base + min(rank, extra), base + (1 if rank < extra else 0))


def all_class_ranges(num_classes: int, world_size: int) -> list[ClassRange]:
    return [class_range(num_classes, world_size, r) for r in range(world_size)]
