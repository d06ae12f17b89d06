"""Pairs files: the official LFW pairs.txt, pairs CSVs, missing images and malformed lines."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from facetrain.errors import FacetrainError
from facetrain.eval.lfw_pairs import parse_lfw_pairs
from facetrain.eval.pairs import load_pairs
from tests.support.eval_sets import touch_lfw_images


def write_small_lfw(path: Path) -> None:
    """2 folds of 2 matched + 2 mismatched pairs over three people."""
    lines = ["2\t2", "Ann\t1\t2", "Bob\t1\t2", "Ann\t1\tBob\t1", "Ann\t2\tCid\t1"]
    lines += ["Cid\t1\t2", "Ann\t1\t3", "Bob\t2\tCid\t2", "Ann\t3\tCid\t1"]
    path.write_text("\n".join(lines) + "\n")


@pytest.mark.shared_data
def test_official_lfw_pairs_parse_to_ten_folds_of_600(shared_data: Path):
    pairs = parse_lfw_pairs(shared_data / "lfw_pairs.txt")
    assert len(pairs) == 6000
    assert sum(pair.same for pair in pairs) == 3000
    assert np.array_equal(np.bincount([pair.fold for pair in pairs]), [600] * 10)
    for fold in range(10):
        block = pairs[fold * 600 : (fold + 1) * 600]
        assert all(pair.same for pair in block[:300]) and not any(pair.same for pair in block[300:])
    assert all(pair.name1 == pair.name2 for pair in pairs if pair.same)
    assert all(pair.index1 >= 1 and pair.index2 >= 1 for pair in pairs)


@pytest.mark.shared_data
def test_official_lfw_pairs_without_images_report_every_missing_one(shared_data: Path, tmp_path: Path):
    with pytest.raises(FacetrainError, match=r"lfw_pairs.txt: \d+ images used by 6000 pairs are missing"):
        load_pairs(shared_data / "lfw_pairs.txt", images_root=tmp_path)


def test_lfw_pairs_with_images_found_by_extension(tmp_path: Path):
    write_small_lfw(tmp_path / "pairs.txt")
    touch_lfw_images(tmp_path / "images", {"Ann": 3, "Bob": 2, "Cid": 2}, extension=".png")
    pairs = load_pairs(tmp_path / "pairs.txt", images_root=tmp_path / "images")
    assert pairs.num_pairs == 8 and pairs.num_matched == 4
    assert pairs.folds.tolist() == [0, 0, 0, 0, 1, 1, 1, 1]
    assert pairs.issame.tolist() == [True, True, False, False, True, True, False, False]
    assert len(pairs.images) == 7, "each image is listed once however many pairs use it"
    assert all(image.endswith(".png") for image in pairs.images)
    first = pairs.images[pairs.left[0]], pairs.images[pairs.right[0]]
    assert first == (str(tmp_path / "images/Ann/Ann_0001.png"), str(tmp_path / "images/Ann/Ann_0002.png"))


def test_missing_images_error_gives_count_and_first_paths(tmp_path: Path):
    write_small_lfw(tmp_path / "pairs.txt")
    touch_lfw_images(tmp_path, {"Ann": 3, "Bob": 2})
    with pytest.raises(FacetrainError) as error:
        load_pairs(tmp_path / "pairs.txt")
    message = str(error.value)
    assert "2 images used by 4 pairs are missing" in message
    assert "Cid_0001.*" in message and "Cid_0002.*" in message
    assert "--skip-missing" in message and "\n" not in message


def test_skip_missing_drops_pairs_and_reports_them(tmp_path: Path):
    write_small_lfw(tmp_path / "pairs.txt")
    touch_lfw_images(tmp_path, {"Ann": 3, "Bob": 2})
    pairs = load_pairs(tmp_path / "pairs.txt", skip_missing=True)
    assert pairs.num_pairs == 4 and pairs.skipped_pairs == 4
    assert sorted(Path(path).name for path in pairs.missing) == ["Cid_0001.*", "Cid_0002.*"]
    assert pairs.folds.tolist() == [0, 0, 0, 1]
    assert all("Cid" not in image for image in pairs.images)


@pytest.mark.parametrize(
    ("lines", "line_number", "message"),
    [
        (["2\t1", "Ann\t1\t2", "Ann\t1", "Bob\t1\t2", "Ann\t1\tBob\t1"], 3, "expected 'name i j'"),
        (["Ann\t1\t2", "Ann\t1\tBob"], 2, "positive integers, got '1' and 'Bob'"),
        (["Ann\t1\t2", "Ann\tone\tBob\t1"], 2, "positive integers"),
        (["1\t2", "Ann\t1\t2", "Ann\t1\tBob\t1"], 1, "header promises"),
        (["Ann 1 2 3 4 5"], 1, "got 6 fields"),
    ],
)
def test_malformed_lfw_line_names_its_line(tmp_path: Path, lines: list[str], line_number: int, message: str):
    path = tmp_path / "pairs.txt"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(FacetrainError, match=rf"pairs.txt line {line_number}: .*{message}"):
        parse_lfw_pairs(path)


def test_headerless_and_view1_files_have_no_folds(tmp_path: Path):
    path = tmp_path / "pairs.txt"
    path.write_text("Ann 1 2\nAnn 1 Bob 1\n")
    assert [pair.fold for pair in parse_lfw_pairs(path)] == [None, None]
    path.write_text("1\nAnn 1 2\nAnn 1 Bob 1\n")
    assert [pair.fold for pair in parse_lfw_pairs(path)] == [None, None]


def test_pairs_csv_with_header_folds_and_relative_paths(tmp_path: Path):
    for name in ("a.jpg", "b.jpg", "c.jpg"):
        (tmp_path / name).write_bytes(b"")
    (tmp_path / "pairs.csv").write_text("path1,path2,same,fold\na.jpg,b.jpg,1,0\na.jpg,c.jpg,false,1\n")
    pairs = load_pairs(tmp_path / "pairs.csv")
    assert pairs.issame.tolist() == [True, False]
    assert pairs.folds.tolist() == [0, 1]
    assert pairs.images == [str(tmp_path / "a.jpg"), str(tmp_path / "b.jpg"), str(tmp_path / "c.jpg")]


def test_pairs_csv_without_header_uses_the_image_root(tmp_path: Path):
    (tmp_path / "imgs").mkdir()
    for name in ("a.jpg", "b.jpg"):
        (tmp_path / "imgs" / name).write_bytes(b"")
    (tmp_path / "pairs.csv").write_text(f"a.jpg,b.jpg,yes\n{tmp_path / 'imgs/b.jpg'},a.jpg,0\n")
    pairs = load_pairs(tmp_path / "pairs.csv", images_root=tmp_path / "imgs")
    assert pairs.issame.tolist() == [True, False] and pairs.folds is None
    assert len(pairs.images) == 2


@pytest.mark.parametrize(
    ("content", "line_number", "message"),
    [
        ("a.jpg,b.jpg,1\na.jpg,b.jpg,maybe\n", 2, "'same' must be"),
        ("path1,path2,same\na.jpg,b.jpg,1\na.jpg,b.jpg\n", 3, "got 2 fields"),
        ("a.jpg,b.jpg,1,0\na.jpg,b.jpg,1\n", 2, "like the first line"),
        ("a.jpg,b.jpg,1,x\n", 1, "'fold' must be an integer"),
    ],
)
def test_malformed_csv_line_names_its_line(tmp_path: Path, content: str, line_number: int, message: str):
    (tmp_path / "pairs.csv").write_text(content)
    with pytest.raises(FacetrainError, match=rf"pairs.csv line {line_number}: .*{message}"):
        load_pairs(tmp_path / "pairs.csv")


def test_unknown_or_absent_pairs_files(tmp_path: Path):
    with pytest.raises(FacetrainError, match="does not exist"):
        load_pairs(tmp_path / "nope.txt")
    (tmp_path / "pairs.json").write_text("{}")
    with pytest.raises(FacetrainError, match=r"unknown pairs format '.json'; use one of .bin, .csv, .txt"):
        load_pairs(tmp_path / "pairs.json")
