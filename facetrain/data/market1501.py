"""Market-1501 person re-identification layout: `bounding_box_train`, `bounding_box_test`, `query`.

File names read `PPPP_cCsS_FFFFFF_NN.jpg`: person id, camera, sequence, frame, box. The standard
protocol keeps two special ids in the gallery: -1 (junk boxes, ignored when ranking) and 0
(distractors, always wrong matches). Training uses only real ids; the test splits keep every box with
its id so the evaluation can apply the protocol itself.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd

from facetrain.data.dataset import PathReader, SampleTable
from facetrain.data.source_record import DataSource, register_source
from facetrain.errors import FacetrainError

SPLITS = {
    "train": "bounding_box_train",
    "gallery": "bounding_box_test",
    "test": "bounding_box_test",
    "query": "query",
}
JUNK_PID = -1
DISTRACTOR_PID = 0
_NAME = re.compile(r"^(-?\d+)_c(\d+)s\d+_\d+_\d+\.jpg$", re.IGNORECASE)


def parse_market1501_name(name: str) -> tuple[int, int]:
    """`(pid, camid)` of a Market-1501 file name, cameras counted from 1 as in the names."""
    match = _NAME.match(Path(name).name)
    if match is None:
        raise FacetrainError(f"{name} is not a Market-1501 image name like 0002_c1s1_000451_03.jpg")
    return int(match.group(1)), int(match.group(2))


def load_market1501_split(root: str | Path, split: str) -> pd.DataFrame:
    """Columns path, pid, camid of one split (`train`, `gallery`/`test`, `query`), sorted by file name.

    Files that are not Market-1501 images (e.g. Thumbs.db) are ignored, as the reference loaders do.
    """
    if split not in SPLITS:
        raise FacetrainError(f"unknown Market-1501 split {split!r}; choose one of: {', '.join(SPLITS)}")
    folder = Path(root) / SPLITS[split]
    if not folder.is_dir():
        raise FacetrainError(
            f"Market-1501 folder {folder} does not exist; data.path must be the dataset root"
        )
    rows = []
    for path in sorted(folder.iterdir()):
        match = _NAME.match(path.name)
        if match is not None:
            rows.append((str(path), int(match.group(1)), int(match.group(2))))
    if not rows:
        raise FacetrainError(f"Market-1501 folder {folder} has no images named like 0002_c1s1_000451_03.jpg")
    return pd.DataFrame(rows, columns=["path", "pid", "camid"])


def scan_market1501_train(root: str | Path) -> SampleTable:
    """The training split without junk and distractors, person ids relabelled 0..C-1 in id order."""
    frame = load_market1501_split(root, "train")
    frame = frame[frame["pid"] > DISTRACTOR_PID]
    if frame.empty:
        raise FacetrainError(
            f"Market-1501 folder {Path(root) / SPLITS['train']} has no labelled person images"
        )
    pids, labels = np.unique(frame["pid"].to_numpy(), return_inverse=True)
    return SampleTable(
        PathReader([Path(p) for p in frame["path"]]),
        labels,
        [f"{pid:04d}" for pid in pids],
        description=str(Path(root) / SPLITS["train"]),
        cameras=frame["camid"].to_numpy(np.int64),
    )


def is_market1501(path: Path) -> bool:
    return (path / SPLITS["train"]).is_dir()


register_source(
    "market1501",
    DataSource(scan_market1501_train, "folder", "the Market-1501 root folder", recognise=is_market1501),
)
