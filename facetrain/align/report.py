"""What became of each image of an alignment run: the report CSV and the summary counts."""

from __future__ import annotations

import csv
import io
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from facetrain.files import atomic_write_text

REPORT_NAME = "align_report.csv"
ALIGNED = "aligned"
CENTERED = "center"
NO_FACE = "no_face"
UNREADABLE = "unreadable"
WRITTEN_STATUSES = (ALIGNED, CENTERED)


class ImageOutcome(NamedTuple):
    """One source image: its path relative to SRC, what happened, how many faces, and why if it failed."""

    path: str
    status: str
    faces: int
    output: str
    message: str


@dataclass(frozen=True)
class AlignSummary:
    images: int
    counts: Counter
    several_faces: int
    destination: Path
    report: Path

    @property
    def written(self) -> int:
        return sum(self.counts[status] for status in WRITTEN_STATUSES)

    def describe(self) -> str:
        """One paragraph for the terminal: what was written, what was skipped and where it is listed."""
        parts = [f"aligned {self.counts[ALIGNED]} of {self.images} images into {self.destination}"]
        if self.counts[CENTERED]:
            parts.append(f"{self.counts[CENTERED]} without a face centre-cropped")
        if self.counts[NO_FACE]:
            parts.append(f"{self.counts[NO_FACE]} without a face skipped")
        if self.counts[UNREADABLE]:
            parts.append(f"{self.counts[UNREADABLE]} unreadable skipped")
        if self.several_faces:
            parts.append(f"{self.several_faces} with several faces (the largest kept)")
        return "; ".join(parts) + f"; every image is listed in {self.report}"


def write_report(outcomes: list[ImageOutcome], path: Path) -> None:
    """`path,status,faces,output,message`, one row per source image in path order."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(ImageOutcome._fields)
    writer.writerows(sorted(outcomes))
    atomic_write_text(path, buffer.getvalue())


def summarize(outcomes: list[ImageOutcome], destination: Path, report: Path) -> AlignSummary:
    return AlignSummary(
        images=len(outcomes),
        counts=Counter(outcome.status for outcome in outcomes),
        several_faces=sum(outcome.faces > 1 for outcome in outcomes),
        destination=destination,
        report=report,
    )
