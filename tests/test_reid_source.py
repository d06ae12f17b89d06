"""Re-id image sets: person and camera ids from the public sets' file names, folders, CSVs, camera cuts."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from facetrain.data import SOURCES
from facetrain.data.reid_images import load_reid_images, load_reid_selection, scan_reid_train
from facetrain.data.reid_names import naming_scheme, parse_reid_name
from facetrain.errors import FacetrainError
from tests.support.reid_helpers import write_cuhk03_style


@pytest.mark.parametrize(
    "name, expected",
    [
        ("0002_c1s1_000451_03.jpg", (2, 1)),  # Market-1501
        ("-1_c3s2_012345_01.jpg", (-1, 3)),  # Market-1501 junk
        ("0000_c6s1_000001_02.JPG", (0, 6)),  # Market-1501 distractor
        ("0005_c2_f0046985.jpg", (5, 2)),  # DukeMTMC-reID
        ("0001_00.jpg", (1, 1)),  # CUHK03, shots 00-04: camera A
        ("0001_04.png", (1, 1)),
        ("0742_05.jpg", (742, 2)),  # shots 05-09: camera B
        ("0742_09.jpg", (742, 2)),
        ("folder/0003_07.jpg", (3, 2)),
        ("0001_07.txt", None),
        ("Thumbs.db", None),
        ("person_1.jpg", None),
        ("0001_7.jpg", None),
    ],
)
def test_camera_ids_from_names(name: str, expected: tuple[int, int] | None):
    assert parse_reid_name(name) == expected


def test_naming_schemes():
    assert naming_scheme("0002_c1s1_000451_03.jpg") == "market1501"
    assert naming_scheme("0005_c2_f0046985.jpg") == "duke"
    assert naming_scheme("0001_07.jpg") == "cuhk03"
    assert naming_scheme("0001.jpg") is None


def test_folder_of_cuhk03_names(tmp_path: Path):
    folder = write_cuhk03_style(tmp_path / "set", range(3), shots_per_camera=2)
    (folder / "Thumbs.db").write_bytes(b"")
    (folder / "notes.txt").write_text("not an image")
    frame = load_reid_images(folder)
    assert len(frame) == 12
    assert frame["pid"].tolist() == [0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2]
    assert frame["camid"].tolist() == [1, 1, 2, 2] * 3
    assert [Path(p).name for p in frame["path"][:4]] == [
        "0000_00.jpg",
        "0000_01.jpg",
        "0000_05.jpg",
        "0000_06.jpg",
    ]


def test_training_table_keeps_cuhk03_pid_0_and_drops_market_junk_and_distractors(tmp_path: Path):
    table = scan_reid_train(write_cuhk03_style(tmp_path / "cuhk", range(2), shots_per_camera=1))
    assert table.class_names == ["0000", "0001"] and table.labels.tolist() == [0, 0, 1, 1]
    assert table.cameras.tolist() == [1, 2, 1, 2]
    market = tmp_path / "market"
    market.mkdir()
    for name in (
        "-1_c1s1_000001_00.jpg",
        "0000_c1s1_000002_00.jpg",
        "0007_c2s1_000003_00.jpg",
        "0009_c3s1_000004_00.jpg",
    ):
        (market / name).write_bytes(b"")
    table = SOURCES.build("reid", str(market))
    assert table.class_names == ["0007", "0009"] and table.cameras.tolist() == [2, 3]


def test_csv_with_pid_and_camera(tmp_path: Path):
    for name in ("a.jpg", "b.jpg", "c.jpg"):
        (tmp_path / name).write_bytes(b"")
    listed = tmp_path / "set.csv"
    listed.write_text("path,pid,camera\na.jpg,10,1\nb.jpg,10,2\nc.jpg,11,2\n")
    frame = load_reid_images(listed)
    assert frame["pid"].tolist() == [10, 10, 11] and frame["camid"].tolist() == [1, 2, 2]
    assert frame["path"].tolist() == [str(tmp_path / name) for name in ("a.jpg", "b.jpg", "c.jpg")]
    table = scan_reid_train(listed)
    assert table.labels.tolist() == [0, 0, 1] and table.cameras.tolist() == [1, 2, 2]


def test_csv_without_cameras_is_refused(tmp_path: Path):
    (tmp_path / "a.jpg").write_bytes(b"")
    listed = tmp_path / "set.csv"
    listed.write_text("path,pid\na.jpg,10\n")
    with pytest.raises(FacetrainError, match="no camera column"):
        load_reid_images(listed)


def test_camera_cut(tmp_path: Path):
    folder = write_cuhk03_style(tmp_path / "val", range(2), shots_per_camera=2)
    query = load_reid_selection(f"{folder}@1")
    assert set(query["camid"]) == {1} and len(query) == 4
    assert len(load_reid_selection(f"{folder}@1,2")) == 8
    with pytest.raises(FacetrainError, match="no image from camera 3; its cameras are 1, 2"):
        load_reid_selection(f"{folder}@3")


def test_user_errors_are_one_line(tmp_path: Path):
    with pytest.raises(FacetrainError, match="not found"):
        load_reid_images(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FacetrainError, match="no images named like"):
        load_reid_images(tmp_path / "empty")
    mixed = write_cuhk03_style(tmp_path / "mixed", range(1), shots_per_camera=1)
    (mixed / "0002_c1s1_000451_03.jpg").write_bytes(b"")
    with pytest.raises(FacetrainError, match="mixes naming schemes"):
        load_reid_images(mixed)


@pytest.mark.shared_data
def test_cuhk03_val(shared_data: Path):
    val = shared_data / "cuhk03" / "val"
    if not val.is_dir():
        pytest.skip(f"CUHK03 not found at {val}")
    frame = load_reid_images(val)
    assert len(frame) == 938 and frame["pid"].nunique() == 100
    assert set(frame["camid"]) == {1, 2}
    per_person = frame.groupby("pid")["camid"].nunique()
    assert (per_person == 2).all()  # every person is seen by both cameras
    assert np.array_equal(load_reid_selection(f"{val}@1")["camid"].unique(), [1])
