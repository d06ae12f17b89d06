"""A re-id image set: a folder of `PID_CAM...` files, or a CSV of path,pid,camera.

The same reader serves training (`data.source: reid`) and evaluation (`facetrain eval --reid QUERY
GALLERY`), so both see the same person and camera ids. A folder is read flat, its files named in one
scheme of `reid_names` (mixing schemes would mix unrelated person ids); other files are ignored, as
Market-1501's loaders ignore Thumbs.db. A CSV/TSV takes the columns path,pid,camera (header optional,
`label` accepted for `pid`), for sets named any other way.

For evaluation a set can be cut by camera: `val@1` is the images of `val` taken by camera 1 (`@1,3`:
cameras 1 and 3), which is how CUHK03's one-folder splits give a camera-A query and a camera-B gallery.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd

from facetrain.data.dataset import PathReader, SampleTable
from facetrain.data.listfile import is_list_file, read_list_file
from facetrain.data.reid_names import EXAMPLES, NAMING_SCHEMES, naming_scheme
from facetrain.data.source_record import DataSource, register_source
from facetrain.errors import FacetrainError

JUNK_PID = -1
MARKET_DISTRACTOR_PID = 0  # Market-1501's gallery distractors; a real person in the other schemes
_CAMERA_CUT = re.compile(r"^(?P<path>.+)@(?P<cameras>\d+(,\d+)*)$")


def load_reid_selection(spec: str | Path) -> pd.DataFrame:
    """`load_reid_images` of a path, or of `PATH@CAMERAS` cut to those cameras."""
    spec = str(spec)
    match = _CAMERA_CUT.match(spec)
    if match is None or Path(spec).exists():
        return load_reid_images(spec)
    cameras = sorted({int(camera) for camera in match["cameras"].split(",")})
    frame = load_reid_images(match["path"])
    kept = frame[frame["camid"].isin(cameras)].reset_index(drop=True)
    if kept.empty:
        found = ", ".join(str(camera) for camera in sorted(frame["camid"].unique()))
        raise FacetrainError(f"{spec}: no image from camera {match['cameras']}; its cameras are {found}")
    return kept


def load_reid_images(path: str | Path) -> pd.DataFrame:
    """Columns path, pid, camid, and scheme (the naming scheme, or `list`), sorted by file name."""
    path = Path(path)
    if is_list_file(path):
        return _from_list(path)
    if not path.is_dir():
        raise FacetrainError(
            f"re-id images {path} not found: give a folder of PID_CAM images ({EXAMPLES}) or a CSV "
            "of path,pid,camera"
        )
    rows, schemes = [], {}
    for file in sorted(path.iterdir()):
        scheme = naming_scheme(file.name)
        if scheme is None or not file.is_file():
            continue
        pid, camid = NAMING_SCHEMES[scheme](file.stem)
        schemes.setdefault(scheme, file.name)
        rows.append((str(file), pid, camid, scheme))
    if not rows:
        raise FacetrainError(f"re-id folder {path} has no images named like {EXAMPLES}")
    if len(schemes) > 1:
        named = ", ".join(f"{example} ({scheme})" for scheme, example in schemes.items())
        raise FacetrainError(
            f"re-id folder {path} mixes naming schemes: {named}; keep one set's images per folder"
        )
    return pd.DataFrame(rows, columns=["path", "pid", "camid", "scheme"])


def _from_list(path: Path) -> pd.DataFrame:
    frame = read_list_file(path)
    if (frame["camera"] < 0).all():
        raise FacetrainError(
            f"re-id list {path} has no camera column; evaluation needs columns path,pid,camera"
        )
    return pd.DataFrame(
        {"path": frame["path"], "pid": frame["label"], "camid": frame["camera"], "scheme": "list"}
    )


def scan_reid_train(path: str | Path) -> SampleTable:
    """The labelled people of a re-id set, relabelled 0..C-1 in id order, cameras kept.

    Junk boxes (pid -1) never train, nor do Market-1501's distractors (pid 0 in its naming).
    """
    frame = load_reid_images(path)
    unlabelled = (frame["pid"] == JUNK_PID) | (
        (frame["scheme"] == "market1501") & (frame["pid"] == MARKET_DISTRACTOR_PID)
    )
    frame = frame[~unlabelled]
    if frame.empty:
        raise FacetrainError(f"re-id images {path} have no labelled person (only junk or distractors)")
    pids, labels = np.unique(frame["pid"].to_numpy(), return_inverse=True)
    return SampleTable(
        PathReader([Path(p) for p in frame["path"]]),
        labels,
        [f"{pid:04d}" for pid in pids],
        description=str(path),
        cameras=frame["camid"].to_numpy(np.int64),
    )


register_source(
    "reid",
    DataSource(scan_reid_train, None, "a folder of PID_CAM re-id images or a CSV of path,pid,camera"),
)
