"""What a resumed run's head rows mean: the checkpoint's classes against the data's, by name.

Row k of the head is the k-th class of `classes.json`. Resumed on data whose classes differ, even
with the same count, row k would silently train on another identity. So the names are compared
first: a difference is refused in one line naming the first class that differs, unless the run says
`train.remap_classes: true`, in which case rows follow their class by name. A class found in both
keeps its trained row wherever it now sits, a new class starts from a fresh row, and a class the data
no longer has is dropped. That keeps everything the checkpoint learned that still applies, which
keeping rows by position (the other possible meaning of "accept the new classes") would not.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from facetrain.checkpoint import read_classes
from facetrain.errors import EveryRankError


@dataclass(frozen=True)
class ClassRemap:
    """For each class of the run, its row in the checkpoint, or None for a class the checkpoint lacks."""

    checkpoint: Path
    rows: list[int | None]
    dropped: int

    def describe(self) -> str:
        kept = sum(row is not None for row in self.rows)
        return (
            f"note: train.remap_classes: the head's rows follow their classes by name from {self.checkpoint}: "
            f"{kept} classes kept, {len(self.rows) - kept} new (fresh rows), {self.dropped} dropped "
            "(no longer in the data); the head's optimizer state starts fresh, and the data from the start "
            "of an epoch"
        )


def match_classes(checkpoint: Path, names: list[str], data_path: str, remap: bool) -> ClassRemap | None:
    """None when the checkpoint's classes are the data's, in the same order; else the remapping
    (`remap`, train.remap_classes) or a one-line refusal naming the first class that differs."""
    stored = read_classes(checkpoint)
    if stored == names or not stored:  # an import records no classes; its count is checked on loading
        return None
    if not remap:
        position = next(
            (k for k, (old, new) in enumerate(zip(stored, names)) if old != new), min(len(stored), len(names))
        )
        there = repr(stored[position]) if position < len(stored) else "absent"
        here = repr(names[position]) if position < len(names) else "absent"
        raise EveryRankError(
            f"checkpoint {checkpoint} was trained on other classes than data.path {data_path}: class "
            f"{position} is {there} there and {here} here ({len(stored)} classes there, {len(names)} here), "
            "so its head rows would train other identities; resume on the data it was trained with, or "
            "pass --set train.remap_classes=true to keep the rows of the classes in both by name and start the "
            "others fresh"
        )
    row_of = {name: row for row, name in enumerate(stored)}
    rows = [row_of.get(name) for name in names]
    return ClassRemap(checkpoint, rows, dropped=len(set(stored) - set(names)))
