"""Balanced pairs from labelled images (`facetrain pairs`), against a plain itertools reference."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from facetrain.cli import main
from facetrain.errors import FacetrainError
from facetrain.eval.pair_making import balanced_pair_plan
from facetrain.eval.pairs import load_pairs
from tests.support.eval_sets import write_lfw_style_set


def as_pairs(left, right) -> set[tuple[int, int]]:
    return {(int(min(a, b)), int(max(a, b))) for a, b in zip(left, right)}


@pytest.mark.parametrize(
    "counts", [[10] * 10, [3, 1, 7, 2, 5], [5, 5]], ids=["orl-like", "uneven", "two-people"]
)
def test_every_matched_pair_and_as_many_distinct_mismatched_pairs(counts: list[int]):
    labels = np.repeat(np.arange(len(counts)), counts)
    plan = balanced_pair_plan(labels, seed=0, num_folds=10)
    everything = list(itertools.combinations(range(len(labels)), 2))
    matched = {(i, j) for i, j in everything if labels[i] == labels[j]}
    mismatched = {(i, j) for i, j in everything if labels[i] != labels[j]}
    assert as_pairs(plan.left[plan.issame], plan.right[plan.issame]) == matched
    sampled = as_pairs(plan.left[~plan.issame], plan.right[~plan.issame])
    assert len(sampled) == (~plan.issame).sum() == len(matched), "no repeats, balanced"
    assert sampled <= mismatched
    per_fold = np.bincount(plan.folds[plan.issame]), np.bincount(plan.folds[~plan.issame])
    assert all(counts.max() - counts.min() <= 1 for counts in per_fold), "stratified folds"


def test_the_sample_is_seeded_and_uniform():
    labels = np.repeat(np.arange(10), 10)
    first, again = balanced_pair_plan(labels, seed=0), balanced_pair_plan(labels, seed=0)
    other = balanced_pair_plan(labels, seed=1)
    assert as_pairs(first.left, first.right) == as_pairs(again.left, again.right)
    np.testing.assert_array_equal(first.folds, again.folds)
    assert as_pairs(first.left, first.right) != as_pairs(other.left, other.right)
    identity_pairs = [
        tuple(sorted((labels[i], labels[j])))
        for i, j in zip(first.left[~first.issame], first.right[~first.issame])
    ]
    counts = np.array(list({pair: identity_pairs.count(pair) for pair in set(identity_pairs)}.values()))
    assert len(counts) >= 40 and counts.max() <= 25, "450 pairs spread over the 45 identity pairs (10 each)"


def test_fewer_mismatched_pairs_than_matched_takes_them_all():
    labels = np.array([0] * 10 + [1])
    plan = balanced_pair_plan(labels)
    assert plan.issame.sum() == 45 and (~plan.issame).sum() == 10


@pytest.mark.parametrize(
    ("labels", "message"), [([0, 1, 2], "no identity has two images"), ([4, 4, 4], "one identity")]
)
def test_sets_that_cannot_verify_are_user_errors(labels: list[int], message: str):
    with pytest.raises(FacetrainError, match=message):
        balanced_pair_plan(labels)


def run(*args: object):
    return CliRunner().invoke(main, ["pairs", *(str(arg) for arg in args)])


def test_pairs_make_writes_a_csv_that_eval_reads_with_its_folds(tmp_path: Path):
    root = tmp_path / "faces"
    write_lfw_style_set(root)
    out = tmp_path / "elsewhere" / "pairs.csv"
    result = run(root, "-o", out, "--seed", "2", "--folds", "3")
    assert result.exit_code == 0, result.output
    assert (
        "wrote 72 pairs (36 matched, 36 mismatched) of 24 images of 6 identities in 3 folds" in result.output
    )
    assert out.read_text().splitlines()[0] == "path1,path2,same,fold"
    assert out.read_text().splitlines()[1].startswith("../faces/person_0/")
    pairs = load_pairs(out)
    assert pairs.num_pairs == 72 and pairs.num_matched == 36
    assert pairs.folds_source == "the file's" and sorted(set(pairs.folds.tolist())) == [0, 1, 2]
    assert all(Path(image).is_file() for image in pairs.images)

    refused = run(root, "-o", out)
    assert (
        refused.exit_code == 2
        and refused.output.strip() == f"error: {out} already exists; pass --overwrite to replace it"
    )
    before = out.read_text()
    assert run(root, "-o", out, "--overwrite", "--seed", "2", "--folds", "3").exit_code == 0
    assert out.read_text() == before, "the same seed makes the same file"


def test_pairs_help_and_a_bad_root():
    result = CliRunner().invoke(main, ["pairs", "--help"])
    assert (
        result.exit_code == 0
        and "Examples:" in result.output
        and "facetrain pairs data/heldout -o" in result.output
    )
    result = run("/nonexistent/faces", "-o", "/tmp/never.csv")
    assert result.exit_code == 2 and result.output.count("\n") == 1 and "is not a folder" in result.output
