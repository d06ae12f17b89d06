"""The CelebA-dev protocol (tools/celeba_folds.py, #42): people-disjoint folds of balanced pairs, the same
for the same folder and seed. Run as the tool is run, in a subprocess (tools/ is not a package)."""

from __future__ import annotations

import csv
import subprocess
import sys
from collections import Counter, defaultdict
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TOOL = REPO / "tools" / "celeba_folds.py"


def make_people(root: Path, counts: list[int]) -> Path:
    """A folder of people with `counts[i]` (empty) photos each; the tool reads only names."""
    for index, count in enumerate(counts):
        person = root / f"{2 * index:05d}"
        person.mkdir(parents=True)
        for image in range(count):
            (person / f"{index * 100 + image:06d}.jpg").write_bytes(b"")
    return root


def protocol(root: Path, out: Path, *args: str) -> list[dict]:
    result = subprocess.run(
        [sys.executable, str(TOOL), str(root), "-o", str(out), *args], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    with out.open(newline="") as handle:
        return list(csv.DictReader(handle))


def test_folds_are_people_disjoint_balanced_and_deterministic(tmp_path):
    root = make_people(tmp_path / "people", [1 + index % 4 for index in range(60)])
    rows = protocol(root, tmp_path / "a.csv", "--folds", "5", "--pairs", "6")
    fold_of: dict[str, set[str]] = defaultdict(set)
    for row in rows:
        fold_of[row["person1"]].add(row["fold"])
        fold_of[row["person2"]].add(row["fold"])
        assert (row["person1"] == row["person2"]) == (row["same"] == "1")
        assert (row["person1"], row["image1"]) != (row["person2"], row["image2"])
    assert all(len(folds) == 1 for folds in fold_of.values())  # nobody in two folds
    counts = Counter((row["fold"], row["same"]) for row in rows)
    assert counts == {(str(fold), same): 6 for fold in range(1, 6) for same in "01"}
    pairs = [tuple(sorted([(r["person1"], r["image1"]), (r["person2"], r["image2"])])) for r in rows]
    assert len(set(pairs)) == len(pairs)  # no pair twice
    again = protocol(root, tmp_path / "b.csv", "--folds", "5", "--pairs", "6")
    assert again == rows
    other_seed = protocol(root, tmp_path / "c.csv", "--folds", "5", "--pairs", "6", "--seed", "1")
    assert other_seed != rows


def test_a_fold_short_of_matched_pairs_stays_balanced_and_the_tool_never_overwrites(tmp_path):
    root = make_people(tmp_path / "people", [2] * 4 + [1] * 8)  # 4 matched pairs in all
    rows = protocol(root, tmp_path / "a.csv", "--folds", "2", "--pairs", "50")
    for fold in ("1", "2"):
        same = [row["same"] for row in rows if row["fold"] == fold]
        assert same.count("1") == same.count("0") > 0
    refused = subprocess.run(
        [sys.executable, str(TOOL), str(root), "-o", str(tmp_path / "a.csv")], capture_output=True, text=True
    )
    assert refused.returncode == 1 and "exists; pass --overwrite" in refused.stderr


def test_celeba_dev_gives_ten_folds_of_300_and_300_pairs(tmp_path, shared_data):
    celeba = shared_data / "celeba_dev"
    if not celeba.is_dir():
        pytest.skip("needs ../shared/data/celeba_dev")
    rows = protocol(celeba, tmp_path / "celeba.csv")
    counts = Counter((row["fold"], row["same"]) for row in rows)
    assert counts == {(str(fold), same): 300 for fold in range(1, 11) for same in "01"}


def test_joined_training_lists_keep_each_sets_people_apart(tmp_path):
    from tools.protocol import join_train_lists

    sets = {"celeba": [("c/a.jpg", 0), ("c/b.jpg", 0), ("c/c.jpg", 1), ("c/d.jpg", 2)], "lfw": []}
    sets["lfw"] = [("l/a.jpg", 0), ("l/b.jpg", 1), ("l/c.jpg", 1)]
    lists = []
    for name, rows in sets.items():
        lists.append(tmp_path / f"{name}.csv")
        with lists[-1].open("w", newline="") as handle:
            csv.writer(handle).writerows([("path", "label"), *rows])
    joined = join_train_lists(lists, tmp_path / "joined.csv")
    with joined.open(newline="") as handle:
        rows = [(row["path"], int(row["label"])) for row in csv.DictReader(handle)]
    # LFW's people are classes 3 and 4, after CelebA's 0-2
    assert rows == sets["celeba"] + [("l/a.jpg", 3), ("l/b.jpg", 4), ("l/c.jpg", 4)]


def test_a_validated_row_trains_on_neither_its_fold_nor_the_next_and_verifies_both(tmp_path):
    from tools.ablate_celeba import validation_fold, write_celeba_split
    from tools.celeba_folds import build_protocol

    root = make_people(tmp_path / "people", [2 + index % 3 for index in range(40)])
    dealt, _ = build_protocol(root, 10, 300, 0)
    assert [validation_fold(fold) for fold in (2, 9, 10)] == [3, 10, 1]
    train_list, pairs_csv, validation_csv = write_celeba_split(root, root, 10, 2, tmp_path / "split", 1)
    with train_list.open(newline="") as handle:
        trained = {Path(row["path"]).parent.name for row in csv.DictReader(handle)}
    assert trained == set().union(*dealt) - set(dealt[9]) - set(dealt[0])
    for path, fold in ((pairs_csv, 10), (validation_csv, 1)):
        with path.open(newline="") as handle:
            pairs = list(csv.DictReader(handle))
        people = {Path(row[key]).parent.name for row in pairs for key in ("path1", "path2")}
        assert people <= set(dealt[fold - 1]) and [row["same"] for row in pairs].count("1") > 0
        assert [row["same"] for row in pairs].count("1") == [row["same"] for row in pairs].count("0")
    plain = write_celeba_split(root, root, 10, 2, tmp_path / "plain")
    assert plain[2] is None and plain[1].read_text() == pairs_csv.read_text()
